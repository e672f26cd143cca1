import BearerdIO
import BearerdOAuth
import Foundation
import Logging
import Testing
#if canImport(Glibc)
import Glibc
@testable import BearerdConfig
@testable import BearerdProxyCore
@testable import BearerdSessions
@testable import BearerdService
#endif

/// docs/architecture.md §5: tokens, secrets and refresh tokens never appear in logs. Runs the session flows
/// (client secret in Basic and in the body, a password, server errors with descriptions,
/// refresh-token rotation, invalid_grant, forced refreshes) through bearerd's own log handler,
/// in both formats and at trace level, and searches every byte written.
@Suite(.serialized)
struct SessionLogHygieneTests {
    static let secrets = ["client-secret-CCC", "password-PPP", "access-AAA-", "refresh-RRR-"]

    /// Runs `body` with a logger writing through `BearerdLogHandler` into a file; returns the text.
    func capture(_ format: LogFormat, _ body: (Logger) async throws -> Void) async throws -> String {
        let root = temporaryDirectory()
        defer { removeTree(root) }
        let path = root + "/log"
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        #expect(fd >= 0)
        let sink = LogSink(fd: fd)
        try await body(Logger(label: "bearerd") { BearerdLogHandler(label: $0, level: .trace, format: format, sink: sink) })
        sink.flush()
        close(fd)
        return String(decoding: FileManager.default.contents(atPath: path) ?? Data(), as: UTF8.self)
    }

    func flows(_ logger: Logger) async throws {
        // client_credentials, Basic and post, with a failing then recovering endpoint.
        let endpoint = try ScriptedTokenEndpoint { _, n in
            n == 1 ? ScriptedTokenEndpoint.error(500, "server_error", "boom for client-secret-CCC?")
                   : ScriptedTokenEndpoint.token("access-AAA-\(n)")
        }
        defer { endpoint.stop() }
        for auth in [ClientAuthentication.clientSecretBasic, .clientSecretPost] {
            let s = SessionConfig(name: "cc", grant: .clientCredentials, tokenURL: endpoint.url, clientID: "id",
                                  clientSecret: .literal(Secret("client-secret-CCC")), clientAuth: auth)
            let m = try SessionManager(config: sessionConfig(s), logger: logger, environment: [:])
            let d = try #require(m.session(named: "cc"))
            if case .failure(let u) = await requestToken(d) {
                // The server echoed the secret in error_description: the 503 detail must not.
                #expect(!u.detail.contains("client-secret-CCC"))
                #expect(u.detail.contains("<redacted>") || !u.detail.contains("boom"))
            }
            #expect(await eventually(8) { if case .success = await requestToken(d) { return true }; return false })
            let t = try await requestToken(d).get()
            _ = await reportRejected(d, generation: t.generation)
            m.stop()
        }
        // password grant refused.
        let refusing = try ScriptedTokenEndpoint { _, _ in ScriptedTokenEndpoint.error(400, "invalid_grant", "bad password") }
        defer { refusing.stop() }
        let p = SessionConfig(name: "pw", grant: .password, tokenURL: refusing.url, clientID: "id",
                              clientSecret: .literal(Secret("client-secret-CCC")), username: "u", password: .literal(Secret("password-PPP")))
        let pm = try SessionManager(config: sessionConfig(p), logger: logger, environment: [:])
        _ = await requestToken(try #require(pm.session(named: "pw")))
        pm.stop()
        // refresh_token rotation, then a dead refresh token.
        let root = temporaryDirectory()
        defer { removeTree(root) }
        writeFile(root + "/rt", "refresh-RRR-0\n")
        let rotating = try ScriptedTokenEndpoint { r, n in
            r.form["refresh_token"] == "refresh-RRR-0" && n == 1
                ? ScriptedTokenEndpoint.token("access-AAA-r1", refresh: "refresh-RRR-1")
                : ScriptedTokenEndpoint.error(400, "invalid_grant", "revoked")
        }
        defer { rotating.stop() }
        let r = SessionConfig(name: "me", grant: .refreshToken, tokenURL: rotating.url, clientID: "cli", clientAuth: .none,
                              refreshTokenFile: root + "/rt")
        let rm = try SessionManager(config: sessionConfig(r, stateDir: root + "/state"), logger: logger, environment: [:])
        let rd = try #require(rm.session(named: "me"))
        let t = try await requestToken(rd).get()
        _ = await reportRejected(rd, generation: t.generation)
        rm.stop()
    }

    @Test(arguments: [LogFormat.text, .json])
    func noSecretInAnyLogLine(format: LogFormat) async throws {
        let text = try await capture(format) { try await flows($0) }
        let lines = text.split(separator: "\n")
        #expect(lines.count >= 8)
        for secret in Self.secrets {
            #expect(!text.contains(secret), "log contains \(secret)")
        }
        // The lines say what happened, with fingerprints instead of values.
        #expect(text.contains(OAuthSecret("access-AAA-r1").fingerprint))
        #expect(text.contains("invalid_grant"))
        #expect(text.contains("needs a new refresh token"))
    }
}
