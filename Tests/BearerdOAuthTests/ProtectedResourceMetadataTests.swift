import Testing
@testable import BearerdOAuth

/// RFC 9728 as bearerd uses it for `issuer: from_upstream`: the metadata URL from the upstream's
/// challenge or the well-known location, the document, the `resource` comparison and the
/// `allowed_issuers` check.
@Suite struct ProtectedResourceMetadataTests {
    /// RFC 9728 §3.2's example response.
    static let rfcExample = #"""
    {
      "resource": "https://resource.example.com",
      "authorization_servers": ["https://as1.example.com", "https://as2.example.net"],
      "bearer_methods_supported": ["header", "body"],
      "scopes_supported": ["profile", "email", "phone"],
      "resource_documentation": "https://resource.example.com/resource_documentation.html"
    }
    """#

    @Test func theRFCExampleParses() throws {
        let meta = try ProtectedResourceMetadata.parse(Array(Self.rfcExample.utf8))
        #expect(meta.resource == "https://resource.example.com")
        #expect(meta.authorizationServers == ["https://as1.example.com", "https://as2.example.net"])
        #expect(try meta.check(expectedResource: "https://resource.example.com", allowedIssuers: ["https://as2.example.net"])
                == "https://as2.example.net")
        // The document's order decides when several are allowed; the configured spelling is returned.
        #expect(try meta.check(expectedResource: "https://resource.example.com/",
                               allowedIssuers: ["https://as2.example.net", "https://as1.example.com/"]) == "https://as1.example.com/")
    }

    @Test func theWellKnownURLGoesBetweenHostAndPath() {
        // RFC 9728 §3.1's example.
        #expect(ProtectedResourceMetadata.wellKnownURL(resource: "https://resource.example.com/resource1")
                == "https://resource.example.com/.well-known/oauth-protected-resource/resource1")
        #expect(ProtectedResourceMetadata.wellKnownURL(resource: "https://resource.example.com")
                == "https://resource.example.com/.well-known/oauth-protected-resource")
        #expect(ProtectedResourceMetadata.wellKnownURL(resource: "https://resource.example.com/")
                == "https://resource.example.com/.well-known/oauth-protected-resource")
        #expect(ProtectedResourceMetadata.wellKnownURL(resource: "https://Resource.Example.com:443/a/b/?x=1")
                == "https://resource.example.com/.well-known/oauth-protected-resource/a/b/?x=1")
        #expect(ProtectedResourceMetadata.wellKnownURL(resource: "http://127.0.0.1:8080/mcp")
                == "http://127.0.0.1:8080/.well-known/oauth-protected-resource/mcp")
        #expect(ProtectedResourceMetadata.wellKnownURL(resource: "https://[::1]:8443")
                == "https://[::1]:8443/.well-known/oauth-protected-resource")
        for bad in ["resource.example.com", "ftp://r.example", "https://u:p@r.example/", "https://r.example/#f", "https://", "https://r.example:99999/"] {
            #expect(ProtectedResourceMetadata.wellKnownURL(resource: bad) == nil, "\(bad)")
        }
    }

    @Test func theChallengeNamesTheMetadata() throws {
        // RFC 9728 §5.1's example, and with an error as a 401 for a bad token carries it.
        let upstream = "https://resource.example.com"
        for field in [#"Bearer resource_metadata="https://resource.example.com/.well-known/oauth-protected-resource""#,
                      #"Bearer error="invalid_token", error_description="The access token expired", resource_metadata="https://resource.example.com/.well-known/oauth-protected-resource""#,
                      #"Basic realm="x", Bearer realm="api", resource_metadata="https://resource.example.com/.well-known/oauth-protected-resource""#,
                      #"DPoP algs="ES256", resource_metadata="https://resource.example.com/.well-known/oauth-protected-resource""#] {
            let challenges = try WWWAuthenticate.parse(field)
            #expect(try ProtectedResourceMetadata.metadataURL(challenges: challenges, resource: upstream)
                    == "https://resource.example.com/.well-known/oauth-protected-resource", "\(field)")
        }
        #expect(try ProtectedResourceMetadata.metadataURL(challenges: WWWAuthenticate.parse(#"Bearer realm="x""#), resource: upstream) == nil)
        #expect(try ProtectedResourceMetadata.metadataURL(challenges: WWWAuthenticate.parse(#"Basic resource_metadata="https://x.example/""#), resource: upstream) == nil)
        // Cleartext only for a cleartext upstream on the same origin.
        let local = #"Bearer resource_metadata="http://127.0.0.1:9000/.well-known/oauth-protected-resource""#
        #expect(try ProtectedResourceMetadata.metadataURL(challenges: WWWAuthenticate.parse(local), resource: "http://127.0.0.1:9000/api")
                == "http://127.0.0.1:9000/.well-known/oauth-protected-resource")
        for (field, resource) in [(local, upstream), (local, "http://127.0.0.1:9001"),
                                  (#"Bearer resource_metadata="/relative""#, upstream),
                                  (#"Bearer resource_metadata="https://u@x.example/""#, upstream),
                                  (#"Bearer resource_metadata="javascript:alert(1)""#, upstream)] {
            #expect(throws: ProtectedResourceMetadata.Problem.self, "\(field)") {
                try ProtectedResourceMetadata.metadataURL(challenges: WWWAuthenticate.parse(field), resource: resource)
            }
        }
    }

    @Test func theResourceMustBeTheUpstream() {
        let same: [(String, String)] = [
            ("https://resource.example.com", "https://resource.example.com"),
            ("https://resource.example.com", "https://resource.example.com/"),
            ("HTTPS://Resource.Example.COM", "https://resource.example.com"),
            ("https://resource.example.com:443/api", "https://resource.example.com/api"),
            ("http://api.local:80", "http://api.local"),
            ("https://[::1]:8443/x", "https://[::1]:8443/x"),
            ("https://r.example/a?b=1", "https://r.example/a?b=1"),
        ]
        for (a, b) in same { #expect(ProtectedResourceMetadata.resourceMatches(a, expected: b), "\(a) vs \(b)") }
        let different: [(String, String)] = [
            ("https://resource.example.com/api", "https://resource.example.com/api/"),   // path exact
            ("https://resource.example.com/API", "https://resource.example.com/api"),
            ("https://resource.example.com/a%2Fb", "https://resource.example.com/a/b"),
            ("http://resource.example.com", "https://resource.example.com"),
            ("https://resource.example.com:8443", "https://resource.example.com"),
            ("https://resource.example.com.evil.example", "https://resource.example.com"),
            ("https://evil.example/resource.example.com", "https://resource.example.com"),
            ("https://resource.example.com@evil.example", "https://resource.example.com"),
            ("https://resource.example.com/#x", "https://resource.example.com/"),
            ("https://r.example/a?b=1", "https://r.example/a"),
            ("https://resource.example.com/api", "https://resource.example.com"),
            ("", "https://resource.example.com"),
        ]
        for (a, b) in different { #expect(!ProtectedResourceMetadata.resourceMatches(a, expected: b), "\(a) vs \(b)") }
    }

    @Test func aForeignAuthorizationServerOrAMismatchedResourceIsRefused() throws {
        func problem(_ json: String, upstream: String = "https://resource.example.com", allowed: [String] = ["https://auth.example.com"]) -> String? {
            do {
                _ = try ProtectedResourceMetadata.parse(Array(json.utf8)).check(expectedResource: upstream, allowedIssuers: allowed)
                return nil
            } catch { return error.reason }
        }
        #expect(problem(Self.rfcExample) == "resource_metadata.issuer_not_allowed")
        #expect(problem(#"{"resource":"https://resource.example.com","authorization_servers":["https://auth.example.com"]}"#) == nil)
        #expect(problem(#"{"resource":"https://resource.example.com","authorization_servers":["https://auth.example.com/"]}"#) == nil)
        #expect(problem(#"{"resource":"https://resource.example.com","authorization_servers":["https://auth.example.com.evil.example"]}"#)
                == "resource_metadata.issuer_not_allowed")
        #expect(problem(#"{"resource":"https://resource.example.com","authorization_servers":["https://AUTH.example.com"]}"#)
                == "resource_metadata.issuer_not_allowed")
        #expect(problem(#"{"resource":"https://other.example.com","authorization_servers":["https://auth.example.com"]}"#)
                == "resource_metadata.resource_mismatch")
        #expect(problem(#"{"resource":"https://resource.example.com","authorization_servers":[]}"#) == "resource_metadata.no_authorization_server")
        #expect(problem(#"{"resource":"https://resource.example.com"}"#) == "resource_metadata.no_authorization_server")
        #expect(problem(#"{"resource":"https://resource.example.com","authorization_servers":"https://auth.example.com"}"#) == "resource_metadata.malformed")
        #expect(problem(#"{"resource":"https://resource.example.com","authorization_servers":[1]}"#) == "resource_metadata.malformed")
        #expect(problem(#"{"authorization_servers":["https://auth.example.com"]}"#) == "resource_metadata.missing_resource")
        #expect(problem(#"{"resource":7}"#) == "resource_metadata.missing_resource")
        #expect(problem("[]") == "resource_metadata.malformed")
        #expect(problem("not json") == "resource_metadata.malformed")
        #expect(problem(#"{"resource":"x"}"# + String(repeating: " ", count: 64 * 1024)) == "resource_metadata.malformed")
        // The refusal names the AS that was refused (for the log line), log-safe.
        do {
            _ = try ProtectedResourceMetadata.parse(Array(#"{"resource":"https://resource.example.com","authorization_servers":["https://evil.example/\u001b[2J"]}"#.utf8))
                .check(expectedResource: "https://resource.example.com", allowedIssuers: ["https://auth.example.com"])
            Issue.record("accepted")
        } catch {
            #expect(error.message.contains("https://evil.example/"))
            #expect(error.message.unicodeScalars.allSatisfy { $0.value >= 0x20 && $0.value < 0x7F })
        }
    }
}
