import BearerdIO
import BearerdTestSupport
import Dispatch
import Foundation
import Glibc
import Logging
import Testing
@testable import BearerdConfig
@testable import BearerdProxyCore
@testable import BearerdSessions
@testable import BearerdService

@Suite("systemd notify protocol")
struct SystemdNotifyTests {
    @Test func notifySocketAddresses() {
        #expect(NotifySocketAddress.parse("/run/systemd/notify") == .path("/run/systemd/notify"))
        #expect(NotifySocketAddress.parse("@/org/freedesktop/systemd1/notify/123") == .abstract("/org/freedesktop/systemd1/notify/123"))
        #expect(NotifySocketAddress.parse("relative/path") == nil)
        #expect(NotifySocketAddress.parse("vsock:2:1234") == nil)
        #expect(NotifySocketAddress.parse("@") == nil)
        #expect(NotifySocketAddress.parse("") == nil)
        #expect(NotifySocketAddress.parse("/" + String(repeating: "a", count: 107)) == nil)
        #expect(NotifySocketAddress.parse("/" + String(repeating: "a", count: 106)) != nil)
    }

    @Test func messagesAreOneAssignmentPerLine() {
        #expect(SystemdMessage.text([("READY", "1"), ("STATUS", "a\nb\r\nc")]) == "READY=1\nSTATUS=a b c")
        let long = SystemdMessage.text([("STATUS", String(repeating: "x", count: 5000))])
        #expect(long.count == "STATUS=".count + SystemdMessage.statusLimit)
    }

    @Test func watchdogPeriodIsHalfTheTimeoutForThisProcessOnly() {
        #expect(SystemdWatchdog.period(environment: [:], pid: 42) == nil)
        #expect(SystemdWatchdog.period(environment: ["WATCHDOG_USEC": "200000"], pid: 42) == .milliseconds(100))
        #expect(SystemdWatchdog.period(environment: ["WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "42"], pid: 42) == .seconds(15))
        #expect(SystemdWatchdog.period(environment: ["WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "7"], pid: 42) == nil)
        #expect(SystemdWatchdog.period(environment: ["WATCHDOG_USEC": "0"], pid: 42) == nil)
        #expect(SystemdWatchdog.period(environment: ["WATCHDOG_USEC": "soon"], pid: 42) == nil)
    }

    /// docs/architecture.md §2.7: as sd_watchdog_enabled(3) does, an unparsable value or USEC_INFINITY
    /// (UINT64_MAX) turns the watchdog off; a valid but huge timeout pings every hour instead of
    /// converting half of it to an `Int` of nanoseconds (which trapped or wrapped).
    @Test func absurdWatchdogTimeoutsAreIgnoredOrClamped() throws {
        for off in ["2e16", "18446744073709551615", "18446744073709551616", "-1", "1.5", ""] {
            #expect(SystemdWatchdog.setting(environment: ["WATCHDOG_USEC": off], pid: 42) == nil, "\(off)")
        }
        for huge in ["20000000000000000", "18446744073709551614", "9223372036854775807", "7200000002"] {
            let setting = try #require(SystemdWatchdog.setting(environment: ["WATCHDOG_USEC": huge], pid: 42))
            #expect(setting.period == SystemdWatchdog.maximumPeriod)
            #expect(setting.clamped)
            #expect(String(setting.timeoutMicroseconds) == huge)
        }
        let hour = try #require(SystemdWatchdog.setting(environment: ["WATCHDOG_USEC": "7200000000"], pid: 42))
        #expect(hour.period == .seconds(3600) && !hour.clamped)
    }

    @Test func durationNanosecondsSaturate() {
        #expect(Duration.seconds(Int64.max).nanoseconds == UInt64(Int64.max))
        #expect(Duration.seconds(18_446_744_040).nanoseconds == UInt64(Int64.max))  // connect: 307445734m
        #expect(Duration.seconds(10_800_000_000).nanoseconds == UInt64(Int64.max))  // request_timeout: 3000000h
        #expect(Duration.milliseconds(-500).nanoseconds == 0)
        #expect(Duration.seconds(-5).nanoseconds == 0)
        #expect(Duration.milliseconds(1500).nanoseconds == 1_500_000_000)
        #expect(Duration.nanoseconds(Int64.max).nanoseconds == UInt64(Int64.max))
    }

    @Test func statusTexts() {
        let shortfalls = [SessionShortfall(session: "partner", detail: "invalid_client (HTTP 401): bad secret"),
                          SessionShortfall(session: "me", detail: nil)]
        #expect(SystemdStatus.starting(listeners: ["127.0.0.1:8080"], waitingFor: shortfalls)
                == "Starting: listening on 127.0.0.1:8080; waiting for the first token of: partner, me")
        #expect(SystemdStatus.serving(listeners: ["127.0.0.1:8080"], sessions: 2, shortfalls: [])
                == "Serving: listening on 127.0.0.1:8080; all 2 sessions hold a token")
        let timedOut = SystemdStatus.serving(listeners: ["127.0.0.1:8080"], sessions: 2, shortfalls: shortfalls, timedOut: true)
        #expect(timedOut.contains("startup timeout; no token for: partner (invalid_client (HTTP 401): bad secret), me (first token request not answered yet)"))
    }

    @Test(arguments: [false, true])
    func notifierSendsToPathAndAbstractSockets(abstract: Bool) throws {
        let receiver = try NotifyReceiver(abstract: abstract)
        let notifier = try #require(SystemdNotifier(environment: ["NOTIFY_SOCKET": receiver.address], logger: Logger(label: "t")))
        #expect(notifier.send([("READY", "1"), ("STATUS", "hello")]))
        #expect(receiver.receive() == "READY=1\nSTATUS=hello")
    }

    @Test func noNotifierWithoutNotifySocket() {
        #expect(SystemdNotifier(environment: [:], logger: Logger(label: "t")) == nil)
        #expect(SystemdNotifier(environment: ["NOTIFY_SOCKET": "not/absolute"], logger: Logger(label: "t")) == nil)
        #expect(SystemdService(environment: [:], pid: 1, logger: Logger(label: "t")) == nil)
    }
}

/// A probe whose sessions and loops the test controls.
final class ScriptedProbeState: @unchecked Sendable {  // @unchecked: guarded by `lock`
    private let lock = Lock()
    private var missing: [SessionShortfall]
    init(missing: [SessionShortfall]) { self.missing = missing }
    func set(_ m: [SessionShortfall]) { lock.withLock { missing = m } }
    var current: [SessionShortfall] { lock.withLock { missing } }
}

@Suite("systemd service lifecycle", .serialized)
struct SystemdServiceTests {
    func service(_ receiver: NotifyReceiver, watchdogUSEC: Int? = nil) throws -> SystemdService {
        var env = ["NOTIFY_SOCKET": receiver.address]
        if let watchdogUSEC { env["WATCHDOG_USEC"] = "\(watchdogUSEC)" }
        return try #require(SystemdService(environment: env, pid: getpid(), logger: Logger(label: "t")))
    }

    func probe(_ state: ScriptedProbeState, loops: [EventLoop] = []) -> SystemdService.Probe {
        SystemdService.Probe(listeners: { ["127.0.0.1:8080"] }, sessionCount: { 1 }, shortfalls: { state.current }, loops: loops)
    }

    @Test func readyOnlyOnceEverySessionHoldsAToken() throws {
        let receiver = try NotifyReceiver()
        let svc = try service(receiver)
        let state = ScriptedProbeState(missing: [SessionShortfall(session: "partner", detail: nil)])
        svc.statusInterval = .milliseconds(50)
        svc.started(probe: probe(state), startupTimeout: .seconds(30))
        let first = try #require(receiver.receive())
        #expect(first == "STATUS=Starting: listening on 127.0.0.1:8080; waiting for the first token of: partner")
        #expect(receiver.receive(timeout: .milliseconds(300)) == nil, "no READY=1 while the session has no token")
        state.set([])
        let ready = try #require(receiver.receive())
        #expect(ready == "READY=1\nSTATUS=Serving: listening on 127.0.0.1:8080; the session holds a token")

        // Reload: RELOADING=1 with MONOTONIC_USEC, then READY=1 again.
        svc.reloading()
        let reloading = try #require(receiver.receive())
        #expect(reloading.hasPrefix("RELOADING=1\nMONOTONIC_USEC="))
        svc.reloaded(failure: nil)
        #expect(receiver.receive()?.hasPrefix("READY=1\nSTATUS=Serving:") == true)
        svc.reloading()
        _ = receiver.receive()
        svc.reloaded(failure: "bearerd.yaml:3: routes: expected a list")
        #expect(receiver.receive() == "READY=1\nSTATUS=Reload failed, still running the previous configuration: bearerd.yaml:3: routes: expected a list")

        // A session losing its token after READY shows up in a STATUS= of its own.
        state.set([SessionShortfall(session: "partner", detail: "token.transport: connection refused")])
        let lost = receiver.receive(until: { $0.contains("no token for") })
        #expect(lost.last?.hasPrefix("STATUS=Serving: listening on 127.0.0.1:8080; no token for: partner (token.transport: connection refused)") == true)

        svc.stopping(grace: .seconds(10))
        #expect(receiver.receive(until: { $0.hasPrefix("STOPPING=1") }).last?.hasPrefix("STOPPING=1\nSTATUS=Stopping") == true)
    }

    @Test func startupTimeoutReportsReadyWithTheMissingSessions() throws {
        let receiver = try NotifyReceiver()
        let svc = try service(receiver)
        let state = ScriptedProbeState(missing: [SessionShortfall(session: "partner", detail: "invalid_client (HTTP 401)")])
        let started = monotonicNanos()
        svc.started(probe: probe(state), startupTimeout: .milliseconds(400))
        let messages = receiver.receive(until: { $0.hasPrefix("READY=1") })
        let elapsed = monotonicNanos() - started
        let ready = try #require(messages.last)
        #expect(ready.hasPrefix("READY=1\n"))
        #expect(ready.contains("startup timeout; no token for: partner (invalid_client (HTTP 401))"))
        #expect(elapsed >= 400_000_000)
    }

    @Test func readyIsNotSentAfterStopping() throws {
        let receiver = try NotifyReceiver()
        let svc = try service(receiver)
        let state = ScriptedProbeState(missing: [SessionShortfall(session: "partner", detail: nil)])
        svc.started(probe: probe(state), startupTimeout: .milliseconds(200))
        _ = receiver.receive()
        svc.stopping(grace: .seconds(1))
        #expect(receiver.receive()?.hasPrefix("STOPPING=1") == true)
        #expect(receiver.receive(timeout: .milliseconds(500)) == nil)
    }

    @Test func watchdogPingsStopWhileALoopIsWedged() throws {
        let receiver = try NotifyReceiver()
        let svc = try service(receiver, watchdogUSEC: 100_000)  // a ping every 50 ms
        let loops = [EventLoop(index: 0), EventLoop(index: 1)]
        svc.started(probe: probe(ScriptedProbeState(missing: []), loops: loops), startupTimeout: .seconds(1))
        let early = receiver.receive(until: { _ in false }, timeout: .milliseconds(400))
        #expect(early.contains { $0.hasPrefix("READY=1") })
        #expect(early.filter { $0 == "WATCHDOG=1" }.count >= 4)

        // Wedge loop 1: after at most one more ping, WATCHDOG=1 stops and STATUS= says why.
        let release = DispatchSemaphore(value: 0)
        loops[1].execute { release.wait() }
        let wedged = receiver.receive(until: { $0.contains("not answering") }, timeout: .seconds(2))
        #expect(wedged.last?.contains("Event loop(s) 1 not answering") == true)
        let silent = receiver.receive(until: { _ in false }, timeout: .milliseconds(400))
        #expect(!silent.contains("WATCHDOG=1"), "no WATCHDOG=1 while a loop is wedged: \(silent)")

        // Unwedged: the pings resume.
        release.signal()
        let resumed = receiver.receive(until: { $0 == "WATCHDOG=1" }, timeout: .seconds(2))
        #expect(resumed.last == "WATCHDOG=1")
        svc.stopping(grace: .seconds(1))
    }

    /// A huge WATCHDOG_USEC (valid to systemd) neither traps nor makes the pings fire at once:
    /// one WATCHDOG=1 at start, then nothing for a while; a huge startup timeout does not wrap.
    @Test func hugeWatchdogTimeoutPingsOnceAtStartThenWaits() throws {
        for usec in ["20000000000000000", "18446744073709551614"] {
            let receiver = try NotifyReceiver()
            let svc = try #require(SystemdService(environment: ["NOTIFY_SOCKET": receiver.address, "WATCHDOG_USEC": usec],
                                                  pid: getpid(), logger: Logger(label: "t")))
            svc.statusInterval = .seconds(Int64.max)
            svc.started(probe: probe(ScriptedProbeState(missing: []), loops: [EventLoop(index: 0)]), startupTimeout: .seconds(Int64.max))
            let messages = receiver.receive(until: { _ in false }, timeout: .milliseconds(300))
            #expect(messages.filter { $0 == "WATCHDOG=1" }.count == 1, "\(usec): \(messages)")
            #expect(messages.contains { $0.hasPrefix("READY=1") })
            svc.stopping(grace: .seconds(1))
        }
    }
}

@Suite("socket activation")
struct SocketActivationTests {
    @Test func parsesTheEnvironment() {
        #expect(SocketActivation.parse(environment: [:], pid: 10) == .none)
        #expect(SocketActivation.parse(environment: ["LISTEN_FDS": "2", "LISTEN_PID": "11"], pid: 10)
                == .ignored("LISTEN_PID 11 is not this process (10)"))
        #expect(SocketActivation.parse(environment: ["LISTEN_FDS": "x", "LISTEN_PID": "10"], pid: 10)
                == .ignored("LISTEN_FDS is not a count: x"))
        #expect(SocketActivation.parse(environment: ["LISTEN_FDS": "2", "LISTEN_PID": "10"], pid: 10)
                == .fds([(3, nil), (4, nil)], warning: nil))
        #expect(SocketActivation.parse(environment: ["LISTEN_FDS": "3", "LISTEN_PID": "10", "LISTEN_FDNAMES": "api:admin:"], pid: 10)
                == .fds([(3, "api"), (4, "admin"), (5, nil)], warning: nil))
        #expect(SocketActivation.parse(environment: ["LISTEN_FDS": "2", "LISTEN_PID": "10", "LISTEN_FDNAMES": "api"], pid: 10)
                == .fds([(3, nil), (4, nil)], warning: "LISTEN_FDNAMES has 1 name(s) for 2 fd(s); matching by address only"))
    }

    @Test func takingFromTheEnvironmentUnsetsTheVariables() {
        setenv("LISTEN_PID", "\(getpid())", 1)
        setenv("LISTEN_FDS", "0", 1)
        setenv("LISTEN_FDNAMES", "", 1)
        #expect(SocketActivation.takeFromEnvironment(logger: Logger(label: "t")).isEmpty)
        #expect(getenv("LISTEN_PID") == nil && getenv("LISTEN_FDS") == nil && getenv("LISTEN_FDNAMES") == nil)
    }

    typealias Inherited = SocketActivation.Inherited

    @Test func matchesByNameThenByAddress() {
        var api = ListenerConfig(address: .tcp(host: "127.0.0.1", port: 8080))
        api.name = "api"
        let sock = ListenerConfig(address: .unix(path: "/run/bearerd/api.sock"))
        let v6 = ListenerConfig(address: .tcp(host: "::1", port: 8081))
        let other = ListenerConfig(address: .tcp(host: "127.0.0.1", port: 9000))
        let inherited = [
            Inherited(fd: 3, name: "bearerd.socket", address: .unix(path: "/run/bearerd/api.sock")),
            Inherited(fd: 4, name: "api", address: .tcp(host: "127.0.0.1", port: 18080)),  // the name wins over the address
            Inherited(fd: 5, name: nil, address: .tcp(host: "0:0:0:0:0:0:0:1", port: 8081)),
            Inherited(fd: 6, name: "admin", address: .tcp(host: "127.0.0.1", port: 1)),
            Inherited(fd: 7, name: nil, address: .tcp(host: "127.0.0.1", port: 7777)),
            Inherited(fd: 8, name: nil, address: nil),
        ]
        let plan = SocketActivation.match(inherited, listeners: [api, sock, v6, other], admin: .tcp(host: "127.0.0.1", port: 9901))
        #expect(plan.listeners == [4, 3, 5, nil])
        #expect(plan.admin == 6)
        #expect(plan.unmatched.map(\.fd) == [7, 8])
    }

    @Test func adminByAddressAndEachFdUsedOnce() {
        let a = ListenerConfig(address: .tcp(host: "localhost", port: 8080))
        let inherited = [
            Inherited(fd: 3, name: nil, address: .tcp(host: "127.0.0.1", port: 8080)),
            Inherited(fd: 4, name: nil, address: .tcp(host: "127.0.0.1", port: 8080)),
            Inherited(fd: 5, name: nil, address: .tcp(host: "127.0.0.1", port: 9901)),
        ]
        let plan = SocketActivation.match(inherited, listeners: [a], admin: .tcp(host: "127.0.0.1", port: 9901))
        #expect(plan.listeners == [3])
        #expect(plan.admin == 5)
        #expect(plan.unmatched.map(\.fd) == [4])
        // No admin listener configured: an fd named admin matches nothing.
        let none = SocketActivation.match([Inherited(fd: 3, name: "admin", address: nil)], listeners: [a], admin: nil)
        #expect(none.unmatched.map(\.fd) == [3])
    }

    @Test func addressComparison() {
        #expect(SocketActivation.sameAddress(bound: .tcp(host: "::1", port: 80), configured: .tcp(host: "0:0::1", port: 80)))
        #expect(!SocketActivation.sameAddress(bound: .tcp(host: "::1", port: 80), configured: .tcp(host: "::1", port: 81)))
        #expect(SocketActivation.sameAddress(bound: .tcp(host: "0.0.0.0", port: 80), configured: .tcp(host: "0.0.0.0", port: 80)))
        #expect(!SocketActivation.sameAddress(bound: .tcp(host: "0.0.0.0", port: 80), configured: .tcp(host: "127.0.0.1", port: 80)))
        #expect(SocketActivation.sameAddress(bound: .tcp(host: "::1", port: 80), configured: .tcp(host: "localhost", port: 80)))
        #expect(!SocketActivation.sameAddress(bound: .tcp(host: "10.0.0.1", port: 80), configured: .tcp(host: "example.com", port: 80)))
        #expect(!SocketActivation.sameAddress(bound: .unix(path: "/a"), configured: .tcp(host: "127.0.0.1", port: 80)))
        #expect(SocketActivation.sameAddress(bound: .unix(path: "/run/a.sock"), configured: .unix(path: "/run/a.sock")))
    }

    @Test func addressOfBoundSockets() throws {
        let group = EventLoopGroup(count: 1)
        let tcp = try Listener.bind(host: "127.0.0.1", port: 0, group: group) { fd, _, _ in close(fd) }
        defer { tcp.stop() }
        let bound = try #require(Listener.boundAddress(fd: tcp.fd))
        #expect(SocketActivation.listenAddress(bound) == .tcp(host: "127.0.0.1", port: tcp.localAddress.port))
        let dir = NSTemporaryDirectory() + "bearerd-sa-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false)  // not /tmp itself: others can write there
        let path = dir + "/api.sock"
        let unix = try Listener.bindUnix(path: path, group: group) { fd, _, _ in close(fd) }
        defer { unix.stop() }
        #expect(SocketActivation.listenAddress(try #require(Listener.boundAddress(fd: unix.fd))) == .unix(path: path))
    }

    /// A listening socket made the way systemd makes one, then adopted.
    static func listeningSocket(_ address: SocketAddress) throws -> Int32 {
        let fd = socket(Int32(address.family), Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw IOError("socket", errno) }
        var s = address.storage
        let rc = withUnsafePointer(to: &s) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.bind(fd, $0, address.length) } }
        guard rc == 0, listen(fd, 16) == 0 else { throw IOError("bind/listen", errno) }
        return fd
    }

    @Test func adoptedUnixSocketAcceptsAndIsNotUnlinkedOnStop() throws {
        let path = NSTemporaryDirectory() + "bearerd-adopt-\(UUID().uuidString.prefix(8)).sock"
        defer { unlink(path) }
        let fd = try Self.listeningSocket(try #require(SocketAddress.unix(path)))
        let group = EventLoopGroup(count: 1)
        let accepted = DispatchSemaphore(value: 0)
        let listener = try Listener.adopt(fd: fd, group: group) { cfd, _, _ in close(cfd); accepted.signal() }
        #expect(fcntl(fd, F_GETFD) & FD_CLOEXEC != 0)
        #expect(fcntl(fd, F_GETFL) & O_NONBLOCK != 0)
        let client = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(client) }
        let addr = try #require(SocketAddress.unix(path))
        var st = addr.storage
        let rc = withUnsafePointer(to: &st) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(client, $0, addr.length) } }
        #expect(rc == 0)
        #expect(accepted.wait(timeout: .now() + 5) == .success)
        listener.stop()
        for loop in group.loops { loop.queue.sync {} }  // `stop` ran (it is queued on the accepting loop)
        var info = stat()
        #expect(lstat(path, &info) == 0, "the socket file of an inherited socket stays")
    }

    @Test func adoptRefusesANonListeningSocket() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        #expect(throws: IOError.self) { try Listener.adopt(fd: fd, group: EventLoopGroup(count: 1)) { _, _, _ in } }
        let dgram = socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
        defer { close(dgram) }
        #expect(throws: IOError.self) { try Listener.adopt(fd: dgram, group: EventLoopGroup(count: 1)) { _, _, _ in } }
    }
}
