import Foundation
import Testing
import BearerdTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// The real `bearerd` binary and `state_dir`, secret files and `bearerd check` (issue 31 items
/// 5, 10, 13): a sign-in nobody made yet is a note, not a refusal; an unsafe `state_dir` stops
/// the start; concurrent first uses make one DPoP key; secrets others can read and credentials
/// in clear are warned about; a FIFO named as a secret is an error, not a hang.
@Suite("state_dir and secret files", .serialized, .enabled(if: AuthServerFixture.isAvailable, "\(AuthServerFixture.unavailableReason ?? "")"))
struct StateAndSecretsTests {
    struct Finished {
        var status: Int32?  // nil: still running at the deadline (then killed)
        var stdout: String
        var stderr: String
        var all: String { stdout + stderr }
    }

    /// Runs the binary with a deadline: a command that hangs is killed and reported (status nil).
    static func run(_ args: [String], seconds: Double = 20) throws -> Finished {
        let dir = try RunningBearerd.tempDir("cmd")
        let out = dir + "/out", err = dir + "/err"
        FileManager.default.createFile(atPath: out, contents: nil)
        FileManager.default.createFile(atPath: err, contents: nil)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: CommandLineTests.binary)
        p.arguments = args
        p.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: out))
        p.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: err))
        try p.run()
        let deadline = Date().addingTimeInterval(seconds)
        while p.isRunning && Date() < deadline { usleep(20_000) }
        var status: Int32?
        if p.isRunning {
            kill(p.processIdentifier, SIGKILL)
            p.waitUntilExit()
        } else {
            status = p.terminationStatus
        }
        let read = { (path: String) in (try? String(contentsOfFile: path, encoding: .utf8)) ?? "" }
        return Finished(status: status, stdout: read(out), stderr: read(err))
    }

    // MARK: item 5

    /// `bearerd run` with an authorization_code session nobody signed in to writes its marker;
    /// `check` then says so (not "refused"), exits 0 (the configuration is fine; `bearerd login`
    /// needs it), and still prints the other sessions' notes (private_key_jwt kid and JWK, DPoP
    /// jkt). A marker of earlier versions (one `operator_file=` line) still reads as refused.
    @Test func checkSaysNobodySignedInYetAndKeepsTheOtherNotes() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("pending-signin")
        let (key, _) = try PrivateKeyJWTTests.keyPair("ec", dir: dir)
        chmod(key, 0o600)
        let sessions = """
            state_dir: \(dir)/state
            sessions:
              me:
                grant: authorization_code
                issuer: \(auth.issuer)
                client_id: native
                client_auth: none
                scope: read
              pk:
                grant: client_credentials
                token_url: \(auth.tokenURL)
                client_id: pk-client
                client_auth: private_key_jwt
                client_key_file: \(key)
              d:
                grant: client_credentials
                token_url: \(auth.tokenURL)
                client_id: svc
                client_secret: svc-secret
                dpop: true
            routes:
              - match: /
                upstream: \(auth.apiURL)
                session: me
            """
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", sessions)
        let port = try RunningBearerd.freePort()
        let running = try RunningBearerd(config: "listen: 127.0.0.1:\(port)\n" + sessions, dir: dir)
        defer { _ = running.stop() }
        #expect(running.waitServing(port: port, path: "/early")?.status == 503, "\(running.logs)")
        let marker = dir + "/state/me.reauth"
        let deadline = Date().addingTimeInterval(10)
        while !FileManager.default.fileExists(atPath: marker) && Date() < deadline { usleep(50_000) }
        #expect((try? String(contentsOfFile: marker, encoding: .utf8)) == "operator_file=-\nreason=no_refresh_token\n", "\(running.logs)")

        let check = try Self.run(["check", "-c", cfg])
        #expect(check.status == 0, "\(check.all)")
        #expect(check.stdout.contains("sessions.me: nobody has signed in yet: run `bearerd login me`"), "\(check.all)")
        #expect(!check.all.contains("refused"), "\(check.all)")
        #expect(check.stdout.contains("sessions.pk: private_key_jwt kid "), "\(check.all)")
        #expect(check.stdout.contains("sessions.pk: public JWK to register: {"), "\(check.all)")
        #expect(check.stdout.contains("sessions.d: DPoP key \(dir)/state/d.dpop.pem (ES256), jkt "), "\(check.all)")

        // Before any run wrote a marker (no state file): the same note.
        let fresh = try CommandLineTests.tempFile("bearerd.yaml", sessions.replacingOccurrences(of: "\(dir)/state", with: "\(dir)/fresh"))
        let before = try Self.run(["check", "-c", fresh])
        #expect(before.status == 0 && before.stdout.contains("nobody has signed in yet: run `bearerd login me`"), "\(before.all)")

        // A refusal recorded by an earlier version is still a refusal (an error, exit 1).
        _ = running.stop()
        try "operator_file=-\n".write(toFile: marker, atomically: true, encoding: .utf8)
        let refused = try Self.run(["check", "-c", cfg])
        #expect(refused.status == 1, "\(refused.all)")
        #expect(refused.stderr.contains("sessions.me: the token endpoint refused the stored sign-in (invalid_grant): run `bearerd login me`"), "\(refused.all)")
    }

    // MARK: item 10

    static func minimalConfig(stateDir: String, port: UInt16) -> String {
        """
        listen: 127.0.0.1:\(port)
        state_dir: \(stateDir)
        sessions:
          s:
            grant: client_credentials
            token_url: http://127.0.0.1:9/token
            client_id: c
            client_secret: s
        routes:
          - match: /
            upstream: http://127.0.0.1:9
            session: s
        """
    }

    /// A `state_dir` writable by group or others, or owned by another uid, stops `bearerd run`
    /// (exit 2, the error names the path and the mode) and is a `check` error; 0700 and 0755
    /// directories of our own are fine.
    @Test func runRefusesAnUnsafeStateDir() throws {
        let dir = try RunningBearerd.tempDir("unsafe-state")
        for (name, mode, owner) in [("open", mode_t(0o777), uid_t?.none), ("group", 0o770, nil), ("foreign", 0o700, 65534)] {
            let state = dir + "/" + name
            #expect(mkdir(state, 0o700) == 0 && chmod(state, mode) == 0)
            if let owner { try #require(chown(state, owner, 65534) == 0, "chown needs root") }
            let cfg = try CommandLineTests.tempFile("bearerd.yaml", Self.minimalConfig(stateDir: state, port: try RunningBearerd.freePort()))
            let run = try Self.run(["run", "-c", cfg], seconds: 10)
            #expect(run.status == 2, "\(name): \(run.all)")
            let modeText = "mode 0" + String(mode, radix: 8)
            #expect(run.stderr.contains("state_dir: state.unsafe_directory: \(state): ") && run.stderr.contains(modeText), "\(name): \(run.all)")
            let check = try Self.run(["check", "-c", cfg])
            #expect(check.status == 1 && check.stderr.contains(state) && check.stderr.contains(modeText), "\(name): \(check.all)")
        }
        for (name, mode) in [("private", mode_t(0o700)), ("readable", 0o755)] {
            let state = dir + "/" + name
            #expect(mkdir(state, 0o700) == 0 && chmod(state, mode) == 0)
            let port = try RunningBearerd.freePort(), admin = try RunningBearerd.freePort()
            try FileManager.default.createDirectory(atPath: dir + "/" + name + "-run", withIntermediateDirectories: true)
            let b = try RunningBearerd(config: "admin: 127.0.0.1:\(admin)\n" + Self.minimalConfig(stateDir: state, port: port),
                                       dir: dir + "/" + name + "-run")
            #expect(b.waitServing(port: admin, path: "/healthz")?.status == 200, "\(name): \(b.logs)")
            _ = b.stop()
        }
    }

    /// Concurrent `bearerd token` calls of a DPoP session whose key does not exist yet: the key
    /// is made once (under its flock), so every token is bound to the same jkt, and it is the
    /// one `check` reports.
    @Test func concurrentTokenCommandsMakeOneDPoPKey() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        #expect(try auth.request("POST", "/_test/dpop?enable=1").status == 200)
        let dir = try RunningBearerd.tempDir("dpop-race")
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", """
            state_dir: \(dir)/state
            sessions:
              d:
                grant: client_credentials
                token_url: \(auth.tokenURL)
                client_id: svc
                client_secret: svc-secret
                dpop: true
            routes:
              - match: /
                upstream: http://127.0.0.1:9
                session: d
            """)
        let outputs = Locked<[Finished]>([])
        DispatchQueue.concurrentPerform(iterations: 6) { _ in
            let r = (try? Self.run(["token", "-c", cfg, "d"])) ?? Finished(status: nil, stdout: "", stderr: "did not start")
            outputs.withLock { $0.append(r) }
        }
        let all = outputs.withLock { $0 }
        #expect(all.allSatisfy { $0.status == 0 }, "\(all.map(\.all))")
        let jkts = Set(all.compactMap { DPoPEndToEndTests.boundJKT($0.stdout.trimmingCharacters(in: .newlines)) })
        #expect(jkts.count == 1, "\(jkts)")
        let check = try Self.run(["check", "-c", cfg])
        #expect(jkts.first.map { check.stdout.contains("jkt \($0)") } == true, "\(check.all)")
        let left = try FileManager.default.contentsOfDirectory(atPath: dir + "/state")
        #expect(left.filter { $0.contains(".tmp") }.isEmpty, "\(left)")
    }

    // MARK: item 13

    /// `check` warns (stderr, exit 0) about secret files group or others can read, and about
    /// `http://` token endpoints and `redis://` off this machine (credentials in clear).
    @Test func checkWarnsAboutReadableSecretsAndCleartextCredentials() throws {
        let dir = try RunningBearerd.tempDir("warnings")
        let secret = dir + "/secret", quiet = dir + "/quiet"
        try "s3cret\n".write(toFile: secret, atomically: true, encoding: .utf8)
        try "s3cret\n".write(toFile: quiet, atomically: true, encoding: .utf8)
        #expect(chmod(secret, 0o644) == 0 && chmod(quiet, 0o600) == 0)
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", """
            sessions:
              open:
                grant: client_credentials
                token_url: http://idp.example/token
                client_id: c
                client_secret_file: \(secret)
              closed:
                grant: client_credentials
                token_url: http://127.0.0.1:9/token
                client_id: c
                client_secret_file: \(quiet)
            routes:
              - match: /
                upstream: http://127.0.0.1:9
                session: open
            """)
        let check = try Self.run(["check", "-c", cfg])
        #expect(check.status == 0, "\(check.all)")
        #expect(check.stderr.contains("warning: \(cfg):") && check.stderr.contains("sessions.open.client_secret_file: \(secret) is readable by group or others (mode 0644)"), "\(check.all)")
        #expect(check.stderr.contains("sessions.open.token_url: http://idp.example sends the client's credentials and the tokens in clear"), "\(check.all)")
        #expect(!check.stderr.contains("sessions.closed"), "a 0600 file and a loopback endpoint: no warning: \(check.all)")
        #expect(!check.all.contains("s3cret"))

        // redis:// to another host: warned even when the cache cannot be reached (an error).
        let key = dir + "/key"
        try "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n".write(toFile: key, atomically: true, encoding: .utf8)
        chmod(key, 0o600)
        let redis = try CommandLineTests.tempFile("bearerd.yaml", """
            shared_cache:
              url: redis://192.0.2.1:6379/0
              key_file: \(key)
            sessions:
              closed:
                grant: client_credentials
                token_url: http://127.0.0.1:9/token
                client_id: c
                client_secret_file: \(quiet)
            routes:
              - match: /
                upstream: http://127.0.0.1:9
                session: closed
            """)
        let r = try Self.run(["check", "-c", redis])
        #expect(r.stderr.contains("warning: \(redis):") && r.stderr.contains("shared_cache.url: redis:// to 192.0.2.1 sends the Redis password"), "\(r.all)")
    }

    /// A FIFO named as `client_secret_file`: `check` and `run` fail at once with an error that
    /// says so (opening it used to wait for a writer forever).
    @Test func aFIFOSecretFileIsAnErrorNotAHang() throws {
        let dir = try RunningBearerd.tempDir("fifo")
        let fifo = dir + "/secret"
        #expect(mkfifo(fifo, 0o600) == 0)
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", """
            listen: 127.0.0.1:\(try RunningBearerd.freePort())
            sessions:
              s:
                grant: client_credentials
                token_url: http://127.0.0.1:9/token
                client_id: c
                client_secret_file: \(fifo)
            routes:
              - match: /
                upstream: http://127.0.0.1:9
                session: s
            """)
        for command in ["check", "run"] {
            let r = try Self.run([command, "-c", cfg], seconds: 10)
            #expect(r.status != nil, "\(command) hung on a FIFO")
            #expect(r.status != 0 && r.stderr.contains("client_secret_file: cannot read \(fifo): is a FIFO, not a regular file"), "\(command): \(r.all)")
        }
    }
}

/// A value shared between threads.
final class Locked<Value>: @unchecked Sendable {  // @unchecked: `value` only under `lock`
    private let lock = NSLock()
    private var value: Value
    init(_ value: Value) { self.value = value }
    func withLock<R>(_ body: (inout Value) -> R) -> R {
        lock.lock()
        defer { lock.unlock() }
        return body(&value)
    }
}
