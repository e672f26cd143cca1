import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A Python test peer from `Tests/Fixtures` (gRPC server, WebSocket echo server, ...) run as a
/// child with the tests' interpreter (`AuthServerFixture.python`). The script prints
/// `READY <port>` when it listens and exits when its stdin closes, so a crashed test leaves no
/// process behind. Also runs one-shot client commands of the same scripts (`runClient`).
///
/// Owns the child and its stdin pipe; `stop()` (or deinit) closes stdin and waits for the exit
/// (SIGKILL after 5 s). Thread-safe: `stopped` is guarded by `lock`.
public final class PythonFixture: @unchecked Sendable {  // @unchecked: `stopped` guarded by `lock`
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    public let port: UInt16
    /// Further ports the script announced after the first (`READY <port> <port2> …`).
    public let extraPorts: [UInt16]
    private let process: Process
    private let stdin: Pipe
    private let stderrFile: String
    private let lock = NSLock()
    private var stopped = false

    public static func script(_ name: String) -> String {
        AuthServerFixture.repositoryRoot.appendingPathComponent("Tests/Fixtures/\(name)").path
    }

    /// Why the modules cannot be imported (for a skipped test), or nil.
    public static func unavailable(modules: [String]) -> String? {
        AuthServerFixture.pythonMissing(modules: modules)
    }

    /// Starts `script` with `arguments` and waits (up to `readyTimeout` seconds) for its
    /// `READY <port>` line (`READY <port> <port2> …` for a script with several listeners).
    public init(script name: String, arguments: [String], readyTimeout: Double = 15) throws {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = [AuthServerFixture.python, "-u", Self.script(name)] + arguments
        let input = Pipe(), output = Pipe()
        stderrFile = NSTemporaryDirectory() + "bearerd-fixture-\(UUID().uuidString).log"
        FileManager.default.createFile(atPath: stderrFile, contents: nil)
        p.standardInput = input
        p.standardOutput = output
        p.standardError = FileHandle(forWritingAtPath: stderrFile)
        try p.run()
        process = p
        stdin = input
        // One line from stdout, read on a thread so a silent child cannot hang the test.
        let got = DispatchSemaphore(value: 0)
        final class Line: @unchecked Sendable { var text = "" }  // @unchecked: written before `got` signals, read after
        let line = Line()
        Thread {
            var bytes: [UInt8] = []
            let fh = output.fileHandleForReading
            while true {
                let d = fh.readData(ofLength: 1)
                if d.isEmpty || d.first == 10 { break }
                bytes.append(contentsOf: d)
            }
            line.text = String(decoding: bytes, as: UTF8.self)
            got.signal()
        }.start()
        let ok = got.wait(timeout: .now() + readyTimeout) == .success
        let parts = line.text.split(separator: " ")
        let extra = parts.dropFirst(2).compactMap { UInt16($0) }
        guard ok, parts.count >= 2, parts[0] == "READY", let port = UInt16(parts[1]), extra.count == parts.count - 2 else {
            let log = (try? String(contentsOfFile: stderrFile, encoding: .utf8)) ?? ""
            p.terminate()
            throw Failure(description: "\(name) did not start (\(line.text)): \(log.suffix(2000))")
        }
        self.port = port
        self.extraPorts = extra
    }

    deinit { stop() }

    /// What the child wrote on stderr so far.
    public var log: String { (try? String(contentsOfFile: stderrFile, encoding: .utf8)) ?? "" }

    public func stop() {
        let was = lock.withLock { () -> Bool in
            defer { stopped = true }
            return stopped
        }
        if was { return }
        try? stdin.fileHandleForWriting.close()
        let deadline = Date().addingTimeInterval(5)
        while process.isRunning && Date() < deadline { usleep(20_000) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        try? FileManager.default.removeItem(atPath: stderrFile)
    }

    /// Runs `script` once with `arguments` and returns its stdout (a client command).
    public static func runClient(script name: String, arguments: [String], timeout: Double = 60) throws -> String {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = [AuthServerFixture.python, Self.script(name)] + arguments
        let out = Pipe(), err = Pipe()
        p.standardOutput = out
        p.standardError = err
        p.standardInput = FileHandle.nullDevice
        try p.run()
        let o = out.fileHandleForReading.readDataToEndOfFile()
        let e = err.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        guard p.terminationStatus == 0 else {
            throw Failure(description: "\(name) \(arguments.joined(separator: " ")) exited \(p.terminationStatus): \(String(decoding: e, as: UTF8.self).suffix(2000))")
        }
        return String(decoding: o, as: UTF8.self)
    }
}
