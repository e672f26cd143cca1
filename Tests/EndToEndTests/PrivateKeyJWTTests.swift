import Foundation
import Testing
import BearerdOAuth
import BearerdTLS
import BearerdTestSupport

/// `client_auth: private_key_jwt` (RFC 7523 §2.2) against the Authlib fixture, which verifies
/// the assertion with the registered public key and refuses a replayed `jti` (docs/architecture.md §4 `client_auth`).
@Suite("private_key_jwt", .serialized, .enabled(if: Prerequisite.runs(AuthServerFixture.isAvailable), "\(AuthServerFixture.unavailableReason ?? "")"))
struct PrivateKeyJWTTests {
    /// A key pair made with the openssl command: `ec` (P-256) or `rsa` (2048).
    static func keyPair(_ kind: String, dir: String) throws -> (key: String, publicPEM: String) {
        let key = dir + "/\(kind).pem", pub = dir + "/\(kind).pub"
        let gen = kind == "ec" ? ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key]
                               : ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", key]
        #expect(try DeployTests.run("/usr/bin/openssl", gen).status == 0)
        #expect(try DeployTests.run("/usr/bin/openssl", ["pkey", "-in", key, "-pubout", "-out", pub]).status == 0)
        return (key, try String(contentsOfFile: pub, encoding: .utf8))
    }

    static func register(_ auth: AuthServerFixture, clientID: String, publicPEM: String) throws {
        let body = try JSONSerialization.data(withJSONObject: ["client_id": clientID, "public_key_pem": publicPEM])
        #expect(try auth.request("POST", "/_test/register-jwt-client", headers: [("Content-Type", "application/json")], body: Array(body)).status == 200)
    }

    @Test(arguments: ["ec", "rsa"]) func tokensWithoutASharedSecret(kind: String) throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("pkjwt")
        let (key, pub) = try Self.keyPair(kind, dir: dir)
        try Self.register(auth, clientID: "workload-\(kind)", publicPEM: pub)
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", """
            sessions:
              wl:
                grant: client_credentials
                issuer: http://127.0.0.1:\(auth.port)
                client_id: workload-\(kind)
                client_auth: private_key_jwt
                client_key_file: \(key)
                client_key_id: 2026-11
                scope: read
            routes:
              - match: /
                upstream: \(auth.apiURL)
                session: wl
            """)
        #expect(try CommandLineTests.run(["check", "-c", cfg]).status == 0)
        // Two token requests (no state_dir: no cache), each with a fresh jti.
        for _ in 0..<2 {
            let out = try CommandLineTests.run(["token", "-c", cfg, "wl"])
            #expect(out.status == 0, "\(out.stderr)")
            let api = try auth.request("GET", "/api/x", headers: [("Authorization", "Bearer \(out.stdout.trimmingCharacters(in: .newlines))")])
            #expect(api.status == 200)
        }
    }

    /// A server that keeps the client's JWKS picks the key by `kid` (Glewlwyd refuses an
    /// assertion without one): without `client_key_id` the kid is the key's RFC 7638 thumbprint,
    /// here computed independently by joserfc; `check` prints it and the JWK to register;
    /// `client_key_id` overrides it.
    @Test(arguments: ["ec", "rsa"]) func theDefaultKidIsTheKeysThumbprint(kind: String) throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("pkjwt")
        let (key, pub) = try Self.keyPair(kind, dir: dir)
        let script = """
            import json, sys
            from joserfc.jwk import import_key
            k = import_key(open(sys.argv[1]).read())
            t = k.thumbprint()
            print(json.dumps({"thumbprint": t, "jwk": dict(k.as_dict(private=False), kid=t)}))
            """
        let py = try DeployTests.run("/usr/bin/env", [AuthServerFixture.python, "-c", script, dir + "/\(kind).pub"])
        #expect(py.status == 0, "\(py.stderr)")
        let out = try JSONSerialization.jsonObject(with: Data(py.stdout.utf8)) as? [String: Any]
        let thumbprint = try #require(out?["thumbprint"] as? String)
        let jwk = try #require(out?["jwk"] as? [String: Any])
        _ = pub
        let body = try JSONSerialization.data(withJSONObject: ["client_id": "jwks-\(kind)", "jwks": ["keys": [jwk]]])
        #expect(try auth.request("POST", "/_test/register-jwt-client", headers: [("Content-Type", "application/json")], body: Array(body)).status == 200)
        let text = """
            sessions:
              wl:
                grant: client_credentials
                issuer: http://127.0.0.1:\(auth.port)
                client_id: jwks-\(kind)
                client_auth: private_key_jwt
                client_key_file: \(key)
                scope: read
            routes:
              - match: /
                upstream: \(auth.apiURL)
                session: wl
            """
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", text)
        let check = try CommandLineTests.run(["check", "-c", cfg])
        #expect(check.status == 0, "\(check.stderr)")
        #expect(check.stdout.contains("sessions.wl: private_key_jwt kid \(thumbprint) (RFC 7638 thumbprint of client_key_file)"), "\(check.stdout)")
        let printed = try #require(check.stdout.split(separator: "\n").first { $0.hasPrefix("sessions.wl: public JWK to register: ") })
        let registered = try JSONSerialization.jsonObject(with: Data(printed.dropFirst("sessions.wl: public JWK to register: ".count).utf8)) as? [String: Any]
        for member in kind == "ec" ? ["kty", "crv", "x", "y", "kid"] : ["kty", "n", "e", "kid"] {
            #expect(registered?[member] as? String == jwk[member] as? String, "\(member): \(printed) vs \(jwk)")
        }
        #expect(registered?["d"] == nil)
        let token = try CommandLineTests.run(["token", "-c", cfg, "wl"])
        #expect(token.status == 0, "\(token.stderr)")
        #expect(try auth.request("GET", "/api/x", headers: [("Authorization", "Bearer \(token.stdout.trimmingCharacters(in: .newlines))")]).status == 200)
        // client_key_id overrides the default: a kid this server does not hold is refused.
        let other = try CommandLineTests.tempFile("bearerd.yaml", text.replacingOccurrences(of: "scope: read", with: "scope: read\n    client_key_id: 2026-11"))
        let refused = try CommandLineTests.run(["token", "-c", other, "wl"])
        #expect(refused.status != 0)
        #expect(refused.stderr.contains("invalid_client"), "\(refused.stderr)")
        #expect(try CommandLineTests.run(["check", "-c", other]).stdout.contains("private_key_jwt kid 2026-11 (client_key_id; RFC 7638 thumbprint \(thumbprint))"))
    }

    /// The assertion as bearerd builds it is accepted once; the same one again is refused.
    @Test func aReplayedAssertionIsRefused() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("pkjwt")
        let (key, pub) = try Self.keyPair("ec", dir: dir)
        try Self.register(auth, clientID: "replayer", publicPEM: pub)
        let signer = try JWTSigner(pemFile: key)
        #expect(signer.algorithm == "ES256")
        let input = ClientAssertion.signingInput(algorithm: signer.algorithm, keyID: nil, clientID: "replayer",
                                                 audience: "http://127.0.0.1:\(auth.port)/oauth/token", jti: "jti-1",
                                                 now: Int64(Date().timeIntervalSince1970))
        let assertion = ClientAssertion.assemble(signingInput: input, signature: try signer.sign(Array(input.utf8)))
        let request = TokenRequest(grant: .clientCredentials, clientID: "replayer", clientAuthentication: .privateKeyJWT, scope: "read")
        var withAssertion = request
        withAssertion.clientAssertion = OAuthSecret(assertion)
        let encoded = try withAssertion.encode()
        let headers = encoded.headers.map { ($0.name, $0.value) }
        let first = try auth.request("POST", "/oauth/token", headers: headers, body: encoded.body)
        #expect(first.status == 200, "\(first.bodyText)")
        let second = try auth.request("POST", "/oauth/token", headers: headers, body: encoded.body)
        #expect(second.status == 401 || second.status == 400)
        #expect(second.bodyText.contains("invalid_client"))
        // A wrong key is refused too.
        let (otherKey, _) = try Self.keyPair("rsa", dir: dir)
        let other = try JWTSigner(pemFile: otherKey)
        let input2 = ClientAssertion.signingInput(algorithm: other.algorithm, keyID: nil, clientID: "replayer",
                                                  audience: "http://127.0.0.1:\(auth.port)/oauth/token", jti: "jti-2",
                                                  now: Int64(Date().timeIntervalSince1970))
        withAssertion.clientAssertion = OAuthSecret(ClientAssertion.assemble(signingInput: input2, signature: try other.sign(Array(input2.utf8))))
        let forged = try withAssertion.encode()
        #expect(try auth.request("POST", "/oauth/token", headers: forged.headers.map { ($0.name, $0.value) }, body: forged.body).status != 200)
    }
}

/// `client_auth: tls_client_auth` (RFC 8705 §2): a token endpoint on TLS that requires a client
/// certificate (certificates made for the test) and authenticates the client by it; the body
/// carries `client_id` and no secret.
@Suite("tls_client_auth", .serialized)
struct TLSClientAuthTests {
    @Test func theClientCertificateAuthenticates() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let endpoint = try TestOrigin(tls: try pki.serverContext(requireClientCertificate: true)) { r in
            let form = String(decoding: r.body, as: UTF8.self)
            guard r.clientCertificateSubject?.contains(TestPKI.clientCommonName) == true, form.contains("client_id=svc"),
                  !form.contains("client_secret"), r.head.headers["Authorization"] == nil else {
                return .response(status: 401, headers: [("Content-Type", "application/json")], body: Array(#"{"error":"invalid_client"}"#.utf8))
            }
            return .response(status: 200, headers: [("Content-Type", "application/json")],
                             body: Array(#"{"access_token":"mtls-token","token_type":"Bearer","expires_in":600}"#.utf8))
        }
        defer { endpoint.stop() }
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", """
            sessions:
              m:
                grant: client_credentials
                token_url: https://localhost:\(endpoint.port)/token
                client_id: svc
                client_auth: tls_client_auth
                tls: { ca_file: \(pki.caFile), client_cert: \(pki.clientCertFile), client_key: \(pki.clientKeyFile) }
            routes:
              - match: /
                upstream: http://127.0.0.1:9
                session: m
            """)
        let out = try CommandLineTests.run(["token", "-c", cfg, "m"])
        #expect(out.status == 0, "\(out.stderr)")
        #expect(out.stdout == "mtls-token\n")
        #expect(endpoint.requests.first?.clientCertificateSubject?.contains(TestPKI.clientCommonName) == true)
    }
}
