import Foundation
import BearerdOAuth
import BearerdTestSupport
import Testing
@testable import BearerdConfig
@testable import BearerdSessions

/// `issuer:` discovery warns when the metadata's `token_endpoint_auth_methods_supported` lacks the
/// session's `client_auth`, except for `none` (RFC 7591 §2: a public client): django-oauth-toolkit
/// and Keycloak take public clients without listing it, and every `bearerd token` then warned.
@Suite("Discovery: client_auth warning")
struct DiscoveryWarningTests {
    @Test func aPublicClientIsNotWarnedAboutAMetadataListWithoutNone() throws {
        let origin = try TestOrigin { r in
            let issuer = "http://\(r.head.headers["Host"] ?? "")/o"
            let doc = #"{"issuer":"\#(issuer)","token_endpoint":"\#(issuer)/token/","authorization_endpoint":"\#(issuer)/authorize/","#
                + #""token_endpoint_auth_methods_supported":["client_secret_post","client_secret_basic"]}"#
            return .response(status: 200, headers: [("Content-Type", "application/json")], body: Array(doc.utf8))
        }
        defer { origin.stop() }
        let issuer = "http://127.0.0.1:\(origin.port)/o"
        let url = try EndpointURL.parse(issuer).get()
        func session(_ name: String, _ auth: ClientAuthentication) -> SessionConfig {
            SessionConfig(name: name, grant: .authorizationCode, tokenURL: EndpointURL.discoveryPlaceholder, clientID: "c",
                          clientSecret: auth.usesSecret ? .literal(Secret("s")) : nil, clientAuth: auth, issuer: url)
        }
        let config = BearerdConfig(file: "<test>", listen: [], sessions: [session("public", .none), session("jwt", .privateKeyJWT)], routes: [])
        let logs = CapturedLogs()
        let resolved = try Discovery.resolve(config, logger: logs.logger, useCache: false).get()
        #expect(resolved.sessions[0].tokenURL.text == issuer + "/token/")
        let warnings = logs.lines.filter { $0.contains("does not list this session's client_auth") }
        #expect(warnings.count == 1, "\(logs.text)")
        #expect(warnings.first?.contains("session=jwt") == true, "\(logs.text)")
    }
}
