import Foundation
import Testing
import BearerdIO
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdService

/// The real `bearerd run` under a low RLIMIT_NOFILE (through util-linux's
/// `prlimit`) runs out of descriptors, so its accept source is suspended; a SIGHUP then moves
/// the listener to another port, which stops the suspended listener. libdispatch trapped with
/// "release of a suspended object"; now the process stays up and serves on the new port once
/// the clients are gone. Run in both `io:` modes (the listener's code differs).
@Suite("Listener out of descriptors", .serialized)
struct ListenerExhaustionTests {
    static let prlimit = "/usr/bin/prlimit"
    static var havePrlimit: Bool {
        FileManager.default.isExecutableFile(atPath: prlimit) || ProcessInfo.processInfo.environment["CI"] != nil
    }
    static let limit = 64

    static func yaml(port: UInt16, origin: UInt16, io: String) -> String {
        """
        listen: [127.0.0.1:\(port)]
        loops: 1
        io: \(io)
        timeouts:
          header_read: 60s
          idle: 60s
        routes:
          - match: /
            upstream: http://127.0.0.1:\(origin)
        """
    }

    static func openDescriptors(_ pid: Int32) -> Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? -1
    }

    static func listening(_ port: UInt16) -> Bool {
        (try? TestClient(port: port, timeout: 1)) != nil
    }

    static func alive(_ p: SystemdTests.Running) -> Bool { p.process.isRunning }

    @Test(.enabled(if: havePrlimit), arguments: ["sources", "poller"])
    func reloadMovingTheListenerWhileOutOfDescriptors(io: String) throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let oldPort = try SystemdTests.freePort()
        let newPort = try SystemdTests.freePort()
        let path = try SystemdTests.config(Self.yaml(port: oldPort, origin: origin.port, io: io))
        let p = try SystemdTests.Running(Self.prlimit, ["--nofile=\(Self.limit):\(Self.limit)", CommandLineTests.binary, "run", "-c", path],
                                         env: [:])
        var up = false
        for _ in 0..<100 where !up {
            up = Self.listening(oldPort)
            if !up { Thread.sleep(forTimeInterval: 0.05) }
        }
        try #require(up, "bearerd listens on the first port")

        // More clients than descriptors: the first ones are accepted (in order), the rest wait
        // in the kernel's backlog while the accept source is paused.
        var clients: [TestClient] = []
        for _ in 0..<(Self.limit + 40) { clients.append(try TestClient(port: oldPort)) }
        var exhausted = false
        for _ in 0..<100 where !exhausted {
            exhausted = Self.openDescriptors(p.pid) >= Self.limit
            if !exhausted { Thread.sleep(forTimeInterval: 0.02) }
        }
        try #require(exhausted, "bearerd ran out of descriptors (\(Self.openDescriptors(p.pid)) open)")
        Thread.sleep(forTimeInterval: 0.3)  // a few pause/retry rounds
        #expect(Self.alive(p))

        // Move the listener. The reload needs a descriptor or two (the file, the new socket):
        // free some by closing accepted clients, then SIGHUP at once. A retry of the paused
        // accept may take them first (the reload then fails and says so): free more and repeat.
        let moved = Self.yaml(port: newPort, origin: origin.port, io: io)
        try moved.write(toFile: path, atomically: true, encoding: .utf8)
        var reloaded = false
        for _ in 0..<8 where !reloaded && Self.alive(p) {
            clients.removeFirst(min(8, clients.count))
            p.signal(SIGHUP)
            for _ in 0..<20 where !reloaded && Self.alive(p) {
                reloaded = Self.listening(newPort)
                if !reloaded { Thread.sleep(forTimeInterval: 0.05) }
            }
        }
        #expect(reloaded, "the reload bound the new port")
        Thread.sleep(forTimeInterval: 0.3)
        #expect(Self.alive(p), "bearerd survived stopping a listener paused for lack of descriptors")

        // The clients leave: descriptors come back, the new port serves, the old one is gone.
        clients.removeAll()
        var served: TestClient.Response?
        for _ in 0..<50 where served == nil && Self.alive(p) {
            served = try? TestClient.get(port: newPort, path: "/after")
            if served == nil { Thread.sleep(forTimeInterval: 0.1) }
        }
        #expect(served?.status == 200)
        #expect(served?.bodyText.contains("target=/after") == true)
        #expect(!Self.listening(oldPort), "the old port no longer listens")

        p.signal(SIGTERM)
        let (status, logs) = p.finish()
        #expect(status == 0, "\(logs.suffix(2000))")
        #expect(!logs.contains("suspended object"))
    }
}
