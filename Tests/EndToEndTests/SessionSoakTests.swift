import Foundation
import Testing
import Dispatch
import BearerdProxy
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import Logging

/// The token session under steady load, end to end (docs/architecture.md §6): bearerd in front of the real
/// Authlib server's Bearer-protected `/api/`, a refresh_token session with short-lived access
/// tokens (8 s) and rotating refresh tokens, every access token revoked every 7 s, and the
/// token endpoint answering 500 for 3 s every 21 s. Requests that need a new token while the
/// endpoint is down wait for the next attempt; nobody gets the upstream's 401 or a 503. The
/// memory of the process that hosts bearerd is bounded.
///
/// On failure it prints the story of the first failed requests (timestamped log lines).
/// Bounded: about 45 s of load (`BEARERD_SOAK_SECONDS` overrides it), every client loop ends at
/// the deadline, every request has a 15 s timeout.
@Suite("Session soak: revocations and token endpoint outages under load", .serialized,
       .enabled(if: Prerequisite.runs(AuthServerFixture.isAvailable), "\(AuthServerFixture.unavailableReason ?? "")"))
struct SessionSoakTests {
    /// Counts per status and the failures, from the client threads.
    final class Tally: @unchecked Sendable {  // @unchecked: state guarded by `lock`
        private let lock = NSLock()
        private var statuses: [Int: Int] = [:]
        private var errors: [String] = []
        func count(_ status: Int) { lock.withLock { statuses[status, default: 0] += 1 } }
        func error(_ e: String) { lock.withLock { errors.append(e) } }
        var snapshot: (statuses: [Int: Int], errors: [String]) { lock.withLock { (statuses, errors) } }
    }

    /// Log lines with the milliseconds since the soak started, so a failure can be told as a
    /// story: the request's attempts, the session's token requests, revocations and outages.
    struct TimedLogHandler: LogHandler {
        let sink: CapturedLogs
        let origin: UInt64
        var logLevel: Logger.Level = .trace
        var metadata: Logger.Metadata = [:]
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        func log(level: Logger.Level, message: Logger.Message, metadata explicit: Logger.Metadata?,
                 source: String, file: String, function: String, line: UInt) {
            var all = metadata
            if let explicit { all.merge(explicit) { $1 } }
            let meta = all.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
            sink.append("\(SessionSoakTests.millis(since: origin)) [\(level)] \(message) \(meta)")
        }
    }

    static func millis(since origin: UInt64) -> String {
        let ms = Double(DispatchTime.now().uptimeNanoseconds &- origin) / 1e6
        return String(format: "%9.1fms", ms)
    }

    /// The lines that tell what happened to the failed request `path` (its upstream attempts with
    /// their generations, replays and access line) and, from 1.5 s before its first line to 0.2 s
    /// after its last, to the session (token requests) and the fixture (revocations, outages).
    static func story(of path: String, in lines: [String]) -> [String] {
        func time(_ line: String) -> Double? { line.split(separator: "m", maxSplits: 1).first.flatMap { Double($0.trimmingCharacters(in: .whitespaces)) } }
        let own = lines.filter { $0.contains(path + " ") || $0.contains(path + "\"") || $0.contains("path=" + path) || $0.hasSuffix(path) }
        guard let last = own.last.flatMap(time) else { return ["no log line mentions \(path)"] }
        let first = (own.first.flatMap(time) ?? last) - 1500
        let context = lines.filter { line in
            guard let t = time(line), t >= first, t <= last + 200 else { return false }
            return line.contains("token obtained") || line.contains("token request failed") || line.contains("[test]")
                || line.contains("replaying rejected") || line.contains("not replaying")
        }
        return Array(Set(own + context)).sorted { (time($0) ?? 0) < (time($1) ?? 0) }
    }

    /// Resident set size of this process (which runs bearerd), from /proc/self/status.
    static func residentBytes() -> Int {
        guard let text = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return 0 }
        for line in text.split(separator: "\n") where line.hasPrefix("VmRSS:") {
            let kb = line.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
            return kb * 1024
        }
        return 0
    }

    @Test func steadyLoadWithRevocationsAndOutagesFailsNoRequest() throws {
        let seconds = ProcessInfo.processInfo.environment["BEARERD_SOAK_SECONDS"].flatMap(Double.init) ?? 45
        let auth = try AuthServerFixture.start(tokenLifetime: 8, rotateRefreshTokens: true, graceSeconds: 10)
        defer { auth.stop() }
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("bearerd-soak-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir + "/state", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let seed = dir + "/me.refresh"
        try (try auth.issueRefreshToken(clientID: "cli", user: "alice") + "\n").write(toFile: seed, atomically: true, encoding: .utf8)

        let session = SessionConfig(name: "me", grant: .refreshToken,
                                    tokenURL: EndpointURL(scheme: "http", host: "127.0.0.1", port: auth.port, path: "/oauth/token"),
                                    clientID: "cli", clientAuth: .none, refreshTokenFile: seed)
        var api = route("/", origin: auth.port, basePath: "/api")
        api.session = "me"
        var config = BearerdConfig(file: "<soak>", listen: [.tcp(host: "127.0.0.1", port: 0)], loops: 2,
                                   sessions: [session], routes: [api])
        config.stateDir = dir + "/state"
        config.listeners = [ListenerConfig(address: .tcp(host: "127.0.0.1", port: 0), allowedHosts: ["*"], allowedOrigins: [])]
        let logs = CapturedLogs()
        let origin = DispatchTime.now().uptimeNanoseconds
        let server = try BearerdServer(config: config, logger: Logger(label: "soak") { _ in TimedLogHandler(sink: logs, origin: origin) })
        try server.start()
        defer {
            let done = DispatchSemaphore(value: 0)
            server.shutdown(grace: .seconds(2)) { done.signal() }
            _ = done.wait(timeout: .now() + 10)
        }
        let port = server.boundAddresses[0].port
        let driver = try #require(server.sessions.session(named: "me"))

        let tally = Tally()
        let start = Date()
        let deadline = start.addingTimeInterval(seconds)
        let group = DispatchGroup()
        // 16 clients, each on a keep-alive connection (a new one after any failure).
        for client in 0..<16 {
            group.enter()
            Thread.detachNewThread {
                defer { group.leave() }
                var c: TestClient?
                var n = 0
                while Date() < deadline {
                    n += 1
                    do {
                        if c == nil || c?.sawEOF == true { c = try TestClient(port: port, timeout: 15) }
                        try c?.send("GET /soak/\(client)/\(n) HTTP/1.1\r\nHost: x\r\n\r\n")
                        guard let r = try c?.readResponse() else { continue }
                        tally.count(r.status)
                        if r.status != 200 {
                            logs.append("\(Self.millis(since: origin)) [test] failed /soak/\(client)/\(n)")
                            tally.error("client \(client) request \(n): \(r.status) \(r.bodyText.prefix(200))")
                        }
                    } catch {
                        tally.error("client \(client) request \(n): \(error)")
                        c = nil
                    }
                }
            }
        }
        // Revocations every 7 s; the token endpoint answers 500 for 3 s every 21 s (from 5 s on).
        var rssAfterWarmUp = 0
        var revocations = 0
        var outages = 0
        var nextRevocation = start.addingTimeInterval(7)
        var nextOutage = start.addingTimeInterval(5)
        var outageEnds: Date?
        while Date() < deadline {
            let now = Date()
            if rssAfterWarmUp == 0, now.timeIntervalSince(start) >= 10 { rssAfterWarmUp = Self.residentBytes() }
            if now >= nextRevocation {
                logs.append("\(Self.millis(since: origin)) [test] revoke-all sent")
                try auth.revokeAll()
                logs.append("\(Self.millis(since: origin)) [test] revoke-all done")
                revocations += 1
                nextRevocation = nextRevocation.addingTimeInterval(7)
            }
            if outageEnds == nil, now >= nextOutage {
                try auth.failNextTokenRequests(count: 100_000, status: 500, error: "server_error")
                logs.append("\(Self.millis(since: origin)) [test] outage begins")
                outageEnds = now.addingTimeInterval(3)
                outages += 1
                nextOutage = nextOutage.addingTimeInterval(21)
            }
            if let ends = outageEnds, now >= ends {
                try auth.clearFaults()
                logs.append("\(Self.millis(since: origin)) [test] outage ends")
                outageEnds = nil
            }
            Thread.sleep(forTimeInterval: 0.05)
        }
        if outageEnds != nil { try auth.clearFaults() }
        #expect(group.wait(timeout: .now() + 30) == .success, "client threads did not finish")
        let rssAtEnd = Self.residentBytes()

        let (statuses, errors) = tally.snapshot
        let total = statuses.values.reduce(0, +)
        let stats = try auth.stats()
        let faults = stats["injected_faults"] as? Int ?? 0
        let metrics = driver.metrics
        #expect(errors.isEmpty, "\(errors.count) of \(total) requests failed; first: \(errors.prefix(5))")
        if !errors.isEmpty {
            let lines = logs.lines
            for path in lines.filter({ $0.contains("[test] failed ") }).prefix(3).compactMap({ $0.split(separator: " ").last.map(String.init) }) {
                print("soak: the story of \(path):\n" + Self.story(of: path, in: lines).joined(separator: "\n"))
            }
        }
        #expect(total > 1000, "only \(total) requests in \(seconds) s: \(statuses)")
        #expect(revocations >= Int(seconds / 7) - 1 && outages >= 2)
        #expect(faults > 0, "no token request hit an outage")
        #expect(metrics.forcedRefreshes > 0)
        #expect(metrics.breakerTrips == 0)
        #expect(metrics.rejectionsNotReplayed.isEmpty, "\(metrics.rejectionsNotReplayed)")
        #expect(!logs.text.contains("not replaying rejected request"))
        // Memory: bearerd's process may not grow by more than 64 MiB after the warm-up.
        #expect(rssAfterWarmUp > 0)
        let growth = rssAtEnd - rssAfterWarmUp
        #expect(growth < 64 << 20, "RSS grew by \(growth >> 20) MiB (\(rssAfterWarmUp >> 20) → \(rssAtEnd >> 20) MiB)")
        let replays = logs.lines.filter { $0.contains("replaying rejected request") }
        let provisional = replays.filter { $0.contains("replay.provisional=true") }.count
        // Requests replayed twice: their provisional replay's token was dead too (they used to fail).
        let replayedPaths = replays.compactMap { $0.split(separator: " ").first { $0.hasPrefix("path=") } }
        let secondReplays = replayedPaths.count - Set(replayedPaths).count
        print("soak: \(total) requests \(statuses), \(revocations) revocations, \(outages) outages (\(faults) injected 500s), "
              + "\(metrics.forcedRefreshes) forced refreshes, \(metrics.tokenRequests) token requests, "
              + "\(replays.count) replays (\(provisional) provisional, \(secondReplays) second), RSS \(rssAfterWarmUp >> 20) → \(rssAtEnd >> 20) MiB")
    }
}
