import Foundation
import Testing
@testable import BearerdConfig

/// `shared_cache.key_file` (issue 31 item 13): base64 of 32 bytes or exactly 32 raw bytes, and
/// never 32 characters of text taken as a raw key; credential files are regular files, opened
/// without waiting (a FIFO is an error, not a hang).
@Suite struct SharedCacheKeyTests {
    static let key: [UInt8] = Array(0..<32)
    static let base64 = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="

    static func dir() -> String {
        let d = NSTemporaryDirectory() + "bearerd-key-\(UUID().uuidString)"
        try? FileManager.default.createDirectory(atPath: d, withIntermediateDirectories: true)
        return d
    }

    @Test func base64AndRawKeysAreAcceptedAndSayWhich() throws {
        for text in [Self.base64, Self.base64 + "\n", Self.base64 + "\r\n"] {
            let k = try SharedCacheKey.parse(Array(text.utf8)).get()
            #expect(k.bytes == Self.key && k.form == .base64)
        }
        // Binary: bytes outside printable ASCII.
        var raw = Self.key
        raw[5] = 0xFF
        let k = try SharedCacheKey.parse(raw).get()
        #expect(k.bytes == raw && k.form == .raw)
    }

    /// 32 characters of text (a passphrase, 32 hex digits, the base64 of 24 bytes) was taken as
    /// a raw key; now it is refused with the way to make a real one.
    @Test func thirtyTwoCharactersOfTextAreNotARawKey() throws {
        let root = Self.dir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let texts = ["correct horse battery staple!!!!", "0123456789abcdef0123456789abcdef", "AAECAwQFBgcICQoLDA0ODxAREhMUFRYX",
                     "a 31-character passphrase, here\n"]
        for t in texts {
            #expect(t.utf8.count == 32)
            let path = root + "/k"
            try t.write(toFile: path, atomically: true, encoding: .utf8)
            let why = try #require(SharedCacheConfig.keyFileProblem(path), "\(t.debugDescription) accepted as a raw key")
            #expect(why.contains("openssl rand -base64 32"), "\(why)")
            #expect(!why.contains(t.trimmingCharacters(in: .newlines)), "the key file's content is never quoted")
        }
        // 64 hex digits: refused, saying why.
        let hex = String(repeating: "0f", count: 32)
        #expect(SharedCacheKey.parse(Array(hex.utf8)).failureMessage?.contains("hex") == true)
        // Base64 of another length.
        #expect(SharedCacheKey.parse(Array("AAECAwQFBgcICQoLDA0ODxAREhMUFRYX\n".utf8)).failureMessage?.contains("24 bytes") == true)
        #expect(SharedCacheKey.parse(Array("short".utf8)).failureMessage != nil)
        #expect(SharedCacheKey.parse(Array((Self.base64 + "\nAAAA\n").utf8)).failureMessage != nil)
    }

    /// Runs `body` on its own thread; fails the test (instead of hanging it) when it does not
    /// return within `seconds`, then unblocks a reader stuck opening `fifo`.
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

    /// A FIFO named as a secret file: an error naming it, at once (it would wait for a writer).
    @Test func aFIFOIsAnErrorNotAHang() throws {
        let root = Self.dir()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let fifo = root + "/secret"
        #expect(mkfifo(fifo, 0o600) == 0)
        let result = Locked<String?>(nil)
        #expect(Self.returnsPromptly(fifo) {
            do throws(ConfigError) {
                _ = try ConfigLoader.resolveSecret(.file(fifo), environment: [:], file: "t.yaml", line: 1, key: "sessions.s.client_secret_file")
                result.set("read")
            } catch {
                result.set(error.description)
            }
        }, "resolving a FIFO secret hung")
        #expect(result.get()?.contains("is a FIFO, not a regular file") == true, "\(result.get() ?? "-")")
        // And the loader's check of a *_file key at load.
        let yaml = """
            sessions:
              s:
                grant: client_credentials
                token_url: https://idp.example/token
                client_id: c
                client_secret_file: \(fifo)
            routes:
              - match: /
                upstream: http://127.0.0.1:9
                session: s
            """
        let loaded = Locked<String?>(nil)
        #expect(Self.returnsPromptly(fifo) {
            do throws(ConfigErrors) {
                _ = try ConfigLoader.parse(yaml: yaml, file: "t.yaml", environment: [:])
                loaded.set("loaded")
            } catch {
                loaded.set(error.description)
            }
        }, "loading a config naming a FIFO hung")
        #expect(loaded.get()?.contains("client_secret_file: cannot read \(fifo): is a FIFO") == true, "\(loaded.get() ?? "-")")
    }
}

extension Result where Failure == ConfigValueError {
    var failureMessage: String? {
        if case .failure(let e) = self { return e.message }
        return nil
    }
}

/// A value shared with another thread.
final class Locked<Value: Sendable>: @unchecked Sendable {  // @unchecked: `value` only under `lock`
    private let lock = NSLock()
    private var value: Value
    init(_ value: Value) { self.value = value }
    func get() -> Value { lock.lock(); defer { lock.unlock() }; return value }
    func set(_ v: Value) { lock.lock(); value = v; lock.unlock() }
}
