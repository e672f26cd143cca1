import Foundation
import Testing
import BearerdOAuth
import BearerdTLS
@testable import BearerdConfig
@testable import BearerdSessions

/// Credential files and secrets held in memory (issue 31 item 13): a FIFO named as a credential
/// makes the session report an error instead of hanging its queue; the Redis password and the
/// shared records' tokens print redacted.
@Suite struct SecretFileTests {
    /// Runs `body` on its own thread; false (instead of hanging the test) when it does not
    /// return within `seconds` — then unblocks a reader stuck opening `fifo`.
    static func returnsPromptly(_ fifo: String, seconds: Double = 5, _ body: @escaping @Sendable () -> Void) -> Bool {
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            body()
            done.signal()
        }
        if done.wait(timeout: .now() + seconds) == .success { return true }
        let w = open(fifo, O_WRONLY | O_NONBLOCK)
        if w >= 0 { close(w) }
        return false
    }

    @Test func aFIFOCredentialIsAnErrorForTheSession() throws {
        let root = temporaryDirectory()
        defer { removeTree(root) }
        let fifo = root + "/assertion"
        #expect(mkfifo(fifo, 0o600) == 0)
        let failure = Locked<String?>(nil)
        #expect(Self.returnsPromptly(fifo) {
            switch SessionSettings.readCredential(key: "assertion_file", path: fifo, mustBeJWT: true, wallClockNow: 0) {
            case .success: failure.withLock { $0 = "read" }
            case .failure(let f): failure.withLock { $0 = "\(f.reason) \(f.errorDescription ?? "")" }
            }
        }, "reading a FIFO credential hung the session")
        let text = failure.withLock { $0 } ?? "-"
        #expect(text.hasPrefix("credential.unreadable") && text.contains("assertion_file") && text.contains("is a FIFO"), "\(text)")

        // A key file (client_key_file, dpop_key_file) read by OpenSSL: the same.
        let keyFIFO = root + "/key.pem"
        #expect(mkfifo(keyFIFO, 0o600) == 0)
        let keyError = Locked<String?>(nil)
        #expect(Self.returnsPromptly(keyFIFO) {
            do throws(TLSError) {
                _ = try JWTSigner(pemFile: keyFIFO)
                keyError.withLock { $0 = "read" }
            } catch {
                keyError.withLock { $0 = error.message }
            }
        }, "reading a FIFO key hung")
        #expect(keyError.withLock { $0 }?.contains("is a FIFO") == true, "\(keyError.withLock { $0 } ?? "-")")
    }

    @Test func theRedisPasswordAndRecordTokensPrintRedacted() {
        let options = RedisOptions(endpoint: .tcp(host: "127.0.0.1", port: 6379, tls: false), database: 0,
                                   password: OAuthSecret("redis-PASSWORD-1234"))
        #expect(!"\(options)".contains("redis-PASSWORD-1234"))
        #expect(!String(reflecting: options).contains("redis-PASSWORD-1234"))
        let record = SharedTokenRecord(accessToken: OAuthSecret("access-TOKEN-5678"), tokenType: "Bearer", expiresAt: 1,
                                       lifetimeSeconds: 1, generation: 1, refreshToken: OAuthSecret("refresh-TOKEN-9012"))
        for text in ["\(record)", String(reflecting: record)] {
            #expect(!text.contains("access-TOKEN-5678") && !text.contains("refresh-TOKEN-9012"), "\(text)")
        }
    }

    /// `<session>.reauth` says why the session waits: no refresh token ever, or a refused one.
    /// A marker of earlier versions (the `operator_file=` line alone) still reads as refused.
    @Test func reauthenticationMarkers() throws {
        let noRT = ReauthenticationMarker.text(.noRefreshToken, operatorFingerprint: nil)
        #expect(noRT == "operator_file=-\nreason=no_refresh_token\n")
        #expect(ReauthenticationMarker.parse(noRT, operatorFingerprint: nil) == .noRefreshToken)
        let refused = ReauthenticationMarker.text(.refused, operatorFingerprint: "abcd1234")
        #expect(ReauthenticationMarker.parse(refused, operatorFingerprint: "abcd1234") == .refused)
        #expect(ReauthenticationMarker.parse(refused, operatorFingerprint: "ffff0000") == nil, "another file content")
        #expect(ReauthenticationMarker.parse("operator_file=-\n", operatorFingerprint: nil) == .refused, "old format")
        #expect(ReauthenticationMarker.parse("operator_file=-\nreason=later\n", operatorFingerprint: nil) == nil)
        #expect(ReauthenticationMarker.parse("", operatorFingerprint: nil) == nil)
        #expect(ReauthenticationMarker.of(TokenEndpointFailure(classification: .invalidGrant, reason: "token.no_refresh_token")) == .noRefreshToken)
        #expect(ReauthenticationMarker.of(TokenEndpointFailure(classification: .invalidGrant, reason: "token.invalid_grant")) == .refused)
    }
}
