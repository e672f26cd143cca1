import Foundation
import Testing

/// The README's first command, copied verbatim out of README.md, run in a fresh clone of the
/// repository's HEAD the way a newcomer runs it: as the current user (root in CI) with a `sudo`
/// on PATH that fails loudly, so a command that needs sudo as root cannot pass. It must install,
/// build and start the demo; the test then curls the demo as the README says (a proxied request
/// shows the injected token's fingerprint; after a revocation the next request still succeeds).
///
/// It builds bearerd in release mode from scratch (several minutes), so CI runs it once, in the
/// default pass (`.ci/run` skips it in the `io: sources` pass). A developer may set
/// `BEARERD_SKIP_QUICKSTART=1` to leave it out of a local run; CI ignores that variable.
@Suite("README quick start", .serialized)
struct QuickStartTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static var enabled: Bool {
        let env = ProcessInfo.processInfo.environment
        return env["CI"] != nil || env["BEARERD_SKIP_QUICKSTART"] == nil
    }

    /// The first ```sh block after the "## Quick start" heading: the command a newcomer copies.
    static func firstCommand(readme: String) throws -> String {
        guard let section = readme.range(of: "## Quick start") else {
            throw Failure("README.md has no '## Quick start' section")
        }
        let rest = readme[section.upperBound...]
        guard let open = rest.range(of: "```sh\n"), let close = rest[open.upperBound...].range(of: "```") else {
            throw Failure("the quick start has no ```sh block")
        }
        let command = rest[open.upperBound..<close.lowerBound].trimmingCharacters(in: .whitespacesAndNewlines)
        return command
    }

    struct Failure: Error, CustomStringConvertible {
        let description: String
        init(_ d: String) { description = d }
    }

    @discardableResult
    static func shell(_ script: String, cwd: URL, env: [String: String]? = nil, log: URL? = nil) throws -> Process {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/bin/bash")
        p.arguments = ["-c", script]
        p.currentDirectoryURL = cwd
        if let env { p.environment = env }
        if let log {
            FileManager.default.createFile(atPath: log.path, contents: nil)
            let h = try FileHandle(forWritingTo: log)
            p.standardOutput = h
            p.standardError = h
        }
        try p.run()
        return p
    }

    /// One GET or POST with curl (the README's client), bounded to 5 s.
    static func curl(_ args: [String]) -> (status: Int32, body: String) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
        p.arguments = ["-s", "--max-time", "5"] + args
        let out = Pipe()
        p.standardOutput = out
        p.standardError = FileHandle.nullDevice
        do { try p.run() } catch { return (-1, "curl: \(error)") }
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return (p.terminationStatus, String(decoding: data, as: UTF8.self))
    }

    @Test func theReadmeCommandIsOneLineWithoutSudoOrSwiftRun() throws {
        let readme = try String(contentsOf: Self.root.appendingPathComponent("README.md"), encoding: .utf8)
        let command = try Self.firstCommand(readme: readme)
        #expect(!command.contains("\n"), "the first command is one line to copy: \(command)")
        // `sudo` is missing on a fresh machine used as root; `swift run` has no --static-swift-stdlib.
        #expect(!command.split(separator: " ").contains("sudo"), "\(command)")
        #expect(!command.contains("swift run"), "\(command)")
    }

    @Test(.enabled(if: enabled), .timeLimit(.minutes(30)))
    func theReadmeFirstCommandBuildsAndStartsTheDemoInAFreshClone() throws {
        let readme = try String(contentsOf: Self.root.appendingPathComponent("README.md"), encoding: .utf8)
        let command = try Self.firstCommand(readme: readme)
        // The ports the README's curl lines use.
        #expect(command.contains("--port 8080") && command.contains("--upstream-port 9000"), "\(command)")

        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("bearerd-quickstart-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: scratch) }
        let clone = scratch.appendingPathComponent("bearerd")
        let cloned = try Self.shell("git clone --quiet \"$0\" bearerd".replacingOccurrences(of: "$0", with: Self.root.path), cwd: scratch)
        cloned.waitUntilExit()
        try #require(cloned.terminationStatus == 0, "git clone of \(Self.root.path) failed")

        // A sudo that fails loudly comes first on PATH: as root the command must not need it.
        let fakeBin = scratch.appendingPathComponent("bin")
        try FileManager.default.createDirectory(at: fakeBin, withIntermediateDirectories: true)
        let sudo = fakeBin.appendingPathComponent("sudo")
        try "#!/bin/sh\necho \"sudo was called: $*\" >&2\nexit 127\n".write(to: sudo, atomically: true, encoding: .utf8)
        try FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: sudo.path)
        var env = ProcessInfo.processInfo.environment
        env["PATH"] = fakeBin.path + ":" + (env["PATH"] ?? "/usr/bin:/bin")
        let isRoot = getuid() == 0

        let log = scratch.appendingPathComponent("quickstart.log")
        let demo = try Self.shell(command, cwd: clone, env: env, log: log)
        defer {
            if demo.isRunning {
                kill(demo.processIdentifier, SIGTERM)
                let deadline = Date().addingTimeInterval(10)
                while demo.isRunning && Date() < deadline { usleep(50_000) }
                if demo.isRunning { kill(demo.processIdentifier, SIGKILL) }
            }
            demo.waitUntilExit()
        }
        func logText() -> String { (try? String(contentsOf: log, encoding: .utf8)) ?? "" }

        // The build from scratch takes minutes; the demo answers once it is up.
        var first = (status: Int32(-1), body: "")
        let deadline = Date().addingTimeInterval(25 * 60)
        while Date() < deadline {
            if !demo.isRunning { break }
            first = Self.curl(["http://127.0.0.1:8080/hello"])
            if first.status == 0 && !first.body.isEmpty { break }
            usleep(500_000)
        }
        try #require(demo.isRunning, "the README's first command exited (status \(demo.terminationStatus)):\n\(logText())")
        try #require(first.status == 0, "the demo never answered on 127.0.0.1:8080:\n\(logText())")
        if isRoot { #expect(!logText().contains("sudo was called"), "\(logText())") }
        #expect(first.body.contains("fingerprint"), "\(first.body)")

        // The README's next lines: revoke, then the first curl again still succeeds (refresh + replay).
        let revoke = Self.curl(["-X", "POST", "http://127.0.0.1:9000/demo/revoke"])
        #expect(revoke.status == 0)
        let again = Self.curl(["-w", "\\n%{http_code}", "http://127.0.0.1:8080/hello"])
        #expect(again.body.hasSuffix("\n200"), "\(again.body)")
        let ready = Self.curl(["-w", "\\n%{http_code}", "http://127.0.0.1:9901/readyz"])
        #expect(ready.body.hasSuffix("\n200"), "\(ready.body)")
    }
}
