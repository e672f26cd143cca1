import Foundation
import Testing
import BearerdIO
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdService

/// A SIGTERM that arrives at any moment of the start (right after READY=1, or
/// while the first token is awaited) stops the real `bearerd run` with exit 0, never lost.
@Suite("Signal races", .serialized)
struct SignalRaceTests {
    /// A config with no session: READY=1 goes out as soon as the listener is bound.
    static func plainConfig(port: UInt16) throws -> String {
        try SystemdTests.config("listen: [127.0.0.1:\(port)]\nloops: 1\nroutes:\n  - match: /\n    upstream: http://127.0.0.1:9\n")
    }

    /// Waits for the exit at most `seconds`; nil (after SIGKILL) when it did not exit.
    static func exitStatus(_ p: SystemdTests.Running, within seconds: Double) -> Int32? {
        let deadline = Date().addingTimeInterval(seconds)
        while p.process.isRunning && Date() < deadline { Thread.sleep(forTimeInterval: 0.01) }
        if p.process.isRunning {
            kill(p.pid, SIGKILL)
            p.process.waitUntilExit()
            return nil
        }
        p.process.waitUntilExit()
        return p.process.terminationStatus
    }

    @Test func sigtermTheMomentReadyArrivesStopsTheProcess() throws {
        let port = try SystemdTests.freePort()
        let path = try Self.plainConfig(port: port)
        var outcomes: [String] = []
        for _ in 0..<10 {
            let notify = try NotifyReceiver()
            let p = try SystemdTests.Running(CommandLineTests.binary, ["run", "-c", path], env: ["NOTIFY_SOCKET": notify.address])
            let messages = notify.receive(until: { $0.hasPrefix("READY=1") }, timeout: .seconds(10))
            p.signal(SIGTERM)
            #expect(messages.last?.hasPrefix("READY=1") == true, "\(messages)")
            let status = Self.exitStatus(p, within: 5)
            let reason = p.process.terminationReason == .uncaughtSignal ? "signal" : "exit"
            outcomes.append(status.map { "\(reason) \($0)" } ?? "hung")
        }
        #expect(outcomes.allSatisfy { $0 == "exit 0" }, "\(outcomes)")
    }

    @Test func sigtermWhileWaitingForTheFirstTokenStopsTheProcess() throws {
        let token = try TestOrigin { _ in .close }  // every token request fails: READY=1 waits
        defer { token.stop() }
        let port = try SystemdTests.freePort()
        let path = try SystemdTests.config(SystemdTests.sessionConfig(listen: port, tokenPort: token.port, origin: 9,
                                                                      extra: "startup_timeout: 60s"))
        for _ in 0..<3 {
            let notify = try NotifyReceiver()
            let p = try SystemdTests.Running(CommandLineTests.binary, ["run", "-c", path], env: ["NOTIFY_SOCKET": notify.address])
            let first = notify.receive(timeout: .seconds(10))
            #expect(first?.hasPrefix("STATUS=Starting:") == true, "\(String(describing: first))")
            p.signal(SIGTERM)
            let stopping = notify.receive(until: { $0.hasPrefix("STOPPING=1") }, timeout: .seconds(5))
            #expect(stopping.last?.hasPrefix("STOPPING=1") == true, "\(stopping)")
            #expect(!stopping.contains { $0.hasPrefix("READY=1") })
            #expect(Self.exitStatus(p, within: 5) == 0)
        }
    }

    @Test func sigtermDuringTheStartStopsTheProcessCleanly() throws {
        // The signal lands somewhere in the start (config load, bind, first notification): no
        // moment may lose it. Delays spread over the first tens of milliseconds.
        let port = try SystemdTests.freePort()
        let path = try Self.plainConfig(port: port)
        var outcomes: [String] = []
        for delay in [0.005, 0.01, 0.02, 0.03, 0.05] {
            let notify = try NotifyReceiver()
            let p = try SystemdTests.Running(CommandLineTests.binary, ["run", "-c", path], env: ["NOTIFY_SOCKET": notify.address])
            Thread.sleep(forTimeInterval: delay)
            p.signal(SIGTERM)
            let status = Self.exitStatus(p, within: 5)
            // Killed by the default action before `main` ran is acceptable (nothing was started);
            // hanging, or any other exit, is not.
            let reason = p.process.terminationReason == .uncaughtSignal ? "signal" : "exit"
            outcomes.append(status.map { "\(reason) \($0)" } ?? "hung")
        }
        #expect(outcomes.allSatisfy { $0 == "exit 0" || $0 == "signal 15" }, "\(outcomes)")
    }
}
