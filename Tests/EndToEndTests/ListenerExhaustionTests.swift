import Foundation
import Testing
import BearerdIO
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdService

/// The real `bearerd run` under a low RLIMIT_NOFILE (through util-linux's `prlimit`) and a
/// connection flood. bearerd derives a client-connection budget from the limit (half of what
/// is left after the descriptors open at start and a reserve: each client may need an upstream
/// connection) and stops accepting at it, so it never runs out of descriptors: accepted clients
/// still get their upstream connection, a SIGHUP still reads its config and binds a new
/// listener (which also stops the old one, paused: libdispatch once trapped on releasing a
/// suspended source), and accepting resumes as clients leave, with one log line per streak and
/// the pauses counted in `/metrics`. Run in both `io:` modes (the listener's code differs).
/// The soft limit is raised to the hard one at start.
@Suite("Listener out of descriptors", .serialized)
struct ListenerExhaustionTests {
    static let prlimit = "/usr/bin/prlimit"
    static var havePrlimit: Bool {
        FileManager.default.isExecutableFile(atPath: prlimit) || ProcessInfo.processInfo.environment["CI"] != nil
    }
    static let limit = 64

    static func yaml(ports: [UInt16], admin: UInt16, origin: UInt16, io: String) -> String {
        """
        listen: [\(ports.map { "127.0.0.1:\($0)" }.joined(separator: ", "))]
        admin: 127.0.0.1:\(admin)
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

    static func count(_ text: String, in logs: String) -> Int {
        logs.components(separatedBy: text).count - 1
    }

    /// A client that connected and sent part of a head: accepted past TCP_DEFER_ACCEPT, then
    /// held open by the 60 s header timeout.
    static func heldClient(_ port: UInt16) throws -> TestClient {
        let c = try TestClient(port: port, timeout: 10)
        try c.send("GET /held HTTP/1.1\r\n")
        return c
    }

    static func metrics(_ admin: UInt16) -> String? {
        (try? TestClient.get(port: admin, path: "/metrics"))?.bodyText
    }

    /// `/metrics` once bearerd serves (at most 10 s).
    static func firstMetrics(_ admin: UInt16) -> String? {
        var text: String?
        _ = TokenSinkTests.wait(seconds: 10) {
            text = metrics(admin)
            return text != nil
        }
        return text
    }

    @Test(.enabled(if: havePrlimit), arguments: ["sources", "poller"])
    func aFloodStopsAtTheBudgetAndAReloadStillWorks(io: String) throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let oldPort = try RunningBearerd.freePort()
        var newPort: UInt16 = 0  // chosen at the reload, below
        let admin = try RunningBearerd.freePort()
        let dir = try RunningBearerd.tempDir("nofile")
        let b = try RunningBearerd(config: Self.yaml(ports: [oldPort], admin: admin, origin: origin.port, io: io), dir: dir,
                                   wrapper: [Self.prlimit, "--nofile=\(Self.limit):\(Self.limit)"])
        defer { _ = b.stop() }
        let pid = b.process.processIdentifier
        let first = try #require(Self.firstMetrics(admin), "bearerd serves: \(b.logs)")
        let budget = Int(try #require(TokenSinkTests.metric(first, "bearerd_connection_budget"), "\(first)"))
        #expect(TokenSinkTests.metric(first, "bearerd_descriptor_limit") == Double(Self.limit))
        #expect(budget >= 4 && budget < Self.limit / 2, "budget \(budget)")

        // The flood: far more clients than descriptors. bearerd takes `budget` of them and
        // leaves the rest in the kernel's backlog; it never reaches its limit.
        var clients: [TestClient] = []
        for _ in 0..<(Self.limit + 40) { clients.append(try Self.heldClient(oldPort)) }
        #expect(b.waitLog("connection budget reached"), "\(b.logs)")
        Thread.sleep(forTimeInterval: 0.3)
        let held = Self.openDescriptors(pid)
        #expect(held < Self.limit, "\(held) descriptors open")
        #expect(!b.logs.contains("Too many open files"), "\(b.logs)")

        // Clients within the budget are served: each needs an upstream connection.
        for c in clients.prefix(4) {
            try c.send("Host: localhost\r\n\r\n")
            let r = try c.readResponse()
            #expect(r.status == 200, "\(r.bodyText) \(b.logs)")
            #expect(r.bodyText.contains("target=/held"))
        }

        // Clients leave one at a time: each frees a slot that one waiting connection takes, and
        // accepting pauses again, all within one streak (one log line).
        for _ in 0..<3 {
            clients.removeFirst()
            Thread.sleep(forTimeInterval: 0.2)
        }
        #expect(Self.count("connection budget reached", in: b.logs) == 1, "\(b.logs)")
        #expect(Self.openDescriptors(pid) < Self.limit)

        // While the flood holds every slot: the listener moves to another port. The reload
        // reads its file and binds the new socket from the reserve.
        // The new port is chosen just before the reload, and chosen again if another process of
        // the parallel suite took it meanwhile (a reload that cannot bind keeps the old listener
        // and says so): a busy port is the test's race, not bearerd's.
        var reloaded = false
        for _ in 1...3 where !reloaded {
            // Chosen now that bearerd holds its ports (chosen before it started, the kernel once
            // handed out the admin port again: "admin … is also a listen address").
            repeat { newPort = try RunningBearerd.freePort() } while newPort == admin || newPort == oldPort
            let failedBefore = Self.count("reload failed", in: b.logs)
            try b.rewrite(Self.yaml(ports: [newPort], admin: admin, origin: origin.port, io: io))
            b.signal(SIGHUP)
            _ = TokenSinkTests.wait(seconds: 30) {
                b.logs.contains("configuration reloaded") || Self.count("reload failed", in: b.logs) > failedBefore
            }
            reloaded = b.logs.contains("configuration reloaded")
            if !reloaded, !b.logs.contains("another process is listening"), !b.logs.contains("in use"),
               !b.logs.contains("is also a listen address") { break }  // any other failure is bearerd's
        }
        #expect(reloaded, "\(b.logs)")
        #expect(!b.logs.contains("cannot read"), "\(b.logs)")
        #expect(b.process.isRunning)
        // The new listener is bound; its first client waits for a slot.
        let newClient = try TestClient(port: newPort, timeout: 20)
        try newClient.send("GET /after HTTP/1.1\r\nHost: localhost\r\n\r\n")

        // All gone: descriptors come back, the new listener is served.
        clients.removeAll()
        let served = try newClient.readResponse()
        #expect(served.status == 200)
        #expect(served.bodyText.contains("target=/after"))
        #expect(!Self.listening(oldPort), "the old port no longer listens")
        var text = ""
        #expect(TokenSinkTests.wait(seconds: 10) {
            text = Self.metrics(admin) ?? ""
            return TokenSinkTests.metric(text, "bearerd_budget_connections") ?? 99 <= 2
        }, "\(text)")
        #expect(TokenSinkTests.metric(text, "bearerd_accept_pauses_total{reason=\"connection_budget\"}") ?? 0 >= 4, "\(text)")
        #expect(TokenSinkTests.metric(text, "bearerd_accept_pauses_total{reason=\"out_of_descriptors\"}") == 0, "\(text)")
        #expect(b.waitLog("below the connection budget again"), "\(b.logs)")

        #expect(b.stop() == 0, "\(b.logs.suffix(2000))")
        #expect(!b.logs.contains("suspended object"))
    }

    /// A soft limit below the hard one is raised at start (as Go's runtime and nginx's
    /// `worker_rlimit_nofile` do): the budget comes from the raised limit.
    @Test(.enabled(if: havePrlimit))
    func theSoftLimitIsRaisedToTheHardLimit() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let port = try RunningBearerd.freePort()
        let admin = try RunningBearerd.freePort()
        let dir = try RunningBearerd.tempDir("nofile-raise")
        let b = try RunningBearerd(config: Self.yaml(ports: [port], admin: admin, origin: origin.port, io: "poller"), dir: dir,
                                   wrapper: [Self.prlimit, "--nofile=64:300"])
        defer { _ = b.stop() }
        let text = try #require(Self.firstMetrics(admin), "\(b.logs)")
        let limits = try String(contentsOfFile: "/proc/\(b.process.processIdentifier)/limits", encoding: .utf8)
        let line = try #require(limits.split(separator: "\n").first { $0.hasPrefix("Max open files") })
        let values = line.split(separator: " ").compactMap { Int($0) }
        #expect(values == [300, 300], "\(line)")
        #expect(TokenSinkTests.metric(text, "bearerd_descriptor_limit") == 300, "\(text)")
        #expect(b.waitLog("raised the descriptor limit"), "\(b.logs)")
    }
}
