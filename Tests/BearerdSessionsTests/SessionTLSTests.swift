import BearerdIO
import BearerdOAuth
import Foundation
import BearerdTestSupport
import Testing
import BearerdTLS
@testable import BearerdConfig
@testable import BearerdProxyCore
@testable import BearerdSessions

/// Token endpoints over https: verified like upstreams (docs/architecture.md §2.3) — a `ca_file` anchors
/// the chain, an unknown CA is a transport failure, never a silent success.
@Suite(.serialized)
struct SessionTLSTests {
    func session(_ url: EndpointURL, caFile: String?) -> SessionConfig {
        SessionConfig(name: "secure", grant: .clientCredentials, tokenURL: url, clientID: "svc",
                      clientSecret: .literal(Secret("tls-client-secret-SSS")), tls: caFile.map { TLSSettings(caFile: $0) },
                      waitTimeout: .milliseconds(500))
    }

    @Test func httpsTokenEndpointWithCAFile() async throws {
        let certs = try TestPKI.generate()
        defer { removeTree(certs.directory) }
        let endpoint = try ScriptedTokenEndpoint(tls: try certs.serverContext()) { _, n in ScriptedTokenEndpoint.token("access-AAA-tls-\(n)") }
        defer { endpoint.stop() }
        #expect(endpoint.url.isTLS)
        let logs = CapturedLogs()
        let manager = try SessionManager(config: sessionConfig(session(endpoint.url, caFile: certs.caFile)), logger: logs.logger, environment: [:])
        defer { manager.stop() }
        let token = try await requestToken(try #require(manager.session(named: "secure"))).get()
        #expect(token.value == "access-AAA-tls-1")
        #expect(endpoint.received.first?.body == "grant_type=client_credentials")
        #expect(logs.lines(containingAnyOf: ["access-AAA-tls", "tls-client-secret-SSS"]).isEmpty)
    }

    @Test func unknownCAIsRefused() async throws {
        let certs = try TestPKI.generate()
        defer { removeTree(certs.directory) }
        let endpoint = try ScriptedTokenEndpoint(tls: try certs.serverContext()) { _, n in ScriptedTokenEndpoint.token("access-AAA-tls-\(n)") }
        defer { endpoint.stop() }
        let logs = CapturedLogs()
        let manager = try SessionManager(config: sessionConfig(session(endpoint.url, caFile: nil)), logger: logs.logger, environment: [:])
        defer { manager.stop() }
        let result = await requestToken(try #require(manager.session(named: "secure")))
        guard case .failure(let u) = result else { Issue.record("expected TokenUnavailable, got \(result)"); return }
        #expect(u.retryAfterSeconds >= 1)
        #expect(endpoint.count == 0)
        #expect(logs.lines.contains { $0.contains("error.reason=token.transport") && $0.contains("tls.") })
    }

    @Test func unreadableCAFileIsAConfigError() throws {
        let url = EndpointURL(scheme: "https", host: "127.0.0.1", port: 1, path: "/t")
        do {
            _ = try SessionManager(config: sessionConfig(session(url, caFile: "/nonexistent/ca.pem")), logger: CapturedLogs().logger, environment: [:])
            Issue.record("expected ConfigErrors")
        } catch {
            #expect(error.description.contains("sessions.secure.tls"))
        }
    }
}
