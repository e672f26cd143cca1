import BearerdIO
import Dispatch
import Foundation
import Logging
#if canImport(Glibc)
import Glibc
import BearerdProxyCore
import BearerdConfig
import BearerdSessions
#endif

// systemd integration without libsystemd.
//
// Theory of operation. Three protocols, each small enough to speak directly:
// - Readiness and status (sd_notify(3)): newline-separated `KEY=VALUE` assignments in one
//   datagram to the AF_UNIX socket named by $NOTIFY_SOCKET (a path, or `@name` for the abstract
//   namespace). `SystemdService` sends READY=1 once the listeners are bound and every session
//   holds its first token (or after `startup_timeout`, with a STATUS= naming the sessions without
//   one and why), RELOADING=1 … READY=1 around a SIGHUP reload, STOPPING=1 on SIGTERM/SIGINT,
//   and STATUS= whenever the one-line summary changes.
// - Watchdog (sd_watchdog_enabled(3)): WATCHDOG=1 every $WATCHDOG_USEC/2 when that is set (and
//   $WATCHDOG_PID, if set, is our pid), but only while every event loop answered the previous
//   ping: a wedged loop stops the pings, and systemd restarts the service.
// - Socket activation (sd_listen_fds(3)): $LISTEN_PID (must be our pid), $LISTEN_FDS (count,
//   fds from 3) and $LISTEN_FDNAMES (colon-separated names, systemd.socket(5)
//   FileDescriptorName=). `SocketActivation.match` pairs each inherited fd with a configured
//   listener, by name first and by address otherwise.
// The parsing and matching are pure functions of their inputs (unit-tested); the I/O is in
// `SocketActivation.takeFromEnvironment` and `SystemdNotifier`.

// MARK: - $NOTIFY_SOCKET

/// Where sd_notify messages go: a socket file path or an abstract-namespace name.
public enum NotifySocketAddress: Sendable, Equatable {
    case path(String)
    /// The name without the leading `@` (sent with a leading NUL byte, unix(7)).
    case abstract(String)

    /// `@name` → abstract, `/absolute/path` → path; nil for anything else (relative paths,
    /// `vsock:` addresses of newer systemd, empty, or longer than `sun_path`).
    public static func parse(_ value: String) -> NotifySocketAddress? {
        let limit = 107  // sizeof(sun_path) - 1 on Linux
        if value.hasPrefix("@") {
            let name = String(value.dropFirst())
            guard !name.isEmpty, name.utf8.count <= limit else { return nil }
            return .abstract(name)
        }
        guard value.hasPrefix("/"), value.utf8.count <= limit else { return nil }
        return .path(value)
    }

    /// The socket address for `sendto` (parse bounds the length, so it always exists).
    var socketAddress: SocketAddress? {
        switch self {
        case .path(let p): return SocketAddress.unix(p)
        case .abstract(let n): return SocketAddress.unixAbstract(n)
        }
    }
}

/// sd_notify message text: one `KEY=VALUE` per line. Values are made single-line (a newline
/// would start a new assignment) and bounded, so a long error cannot swell the datagram.
public enum SystemdMessage {
    public static let statusLimit = 1024

    public static func text(_ fields: [(String, String)]) -> String {
        fields.map { key, value in "\(key)=\(singleLine(value))" }.joined(separator: "\n")
    }

    static func singleLine(_ value: String) -> String {
        var s = value.replacingOccurrences(of: "\r\n", with: " ").replacingOccurrences(of: "\n", with: " ")
            .replacingOccurrences(of: "\r", with: " ")
        if s.count > statusLimit { s = String(s.prefix(statusLimit - 1)) + "…" }
        return s
    }
}

/// The watchdog period from the environment (sd_watchdog_enabled(3)): half of $WATCHDOG_USEC.
///
/// Like sd_watchdog_enabled, the watchdog is off when $WATCHDOG_USEC is unset, not a decimal
/// number that fits in 64 bits (`2e16` is not), 0, or `UINT64_MAX` (USEC_INFINITY: systemd's
/// `timestamp_is_set` refuses it), or when $WATCHDOG_PID names another process. A valid but
/// huge value (systemd accepts up to ~584 000 years) is honoured by pinging every
/// `maximumPeriod` instead: pinging more often than needed is harmless, and the period stays
/// far from any overflow.
public enum SystemdWatchdog {
    /// Longest interval between two WATCHDOG=1 (1 h).
    public static let maximumPeriod: Duration = .seconds(3600)

    public struct Setting: Sendable, Equatable {
        /// How often WATCHDOG=1 is sent: half the timeout, at most `maximumPeriod`.
        public var period: Duration
        /// $WATCHDOG_USEC as systemd set it.
        public var timeoutMicroseconds: UInt64
        /// True when half the timeout was longer than `maximumPeriod` (logged at start).
        public var clamped: Bool
    }

    public static func setting(environment: [String: String], pid: Int32) -> Setting? {
        guard let raw = environment["WATCHDOG_USEC"], let usec = UInt64(raw), usec > 0, usec != .max else { return nil }
        if let owner = environment["WATCHDOG_PID"], !owner.isEmpty, Int32(owner) != pid { return nil }
        let half = Duration.microseconds(Int64(clamping: usec / 2))
        return Setting(period: min(half, maximumPeriod), timeoutMicroseconds: usec, clamped: half > maximumPeriod)
    }

    public static func period(environment: [String: String], pid: Int32) -> Duration? {
        setting(environment: environment, pid: pid)?.period
    }
}

// MARK: - Socket activation

/// Socket activation (sd_listen_fds(3)): the fds systemd passed and the configured listener
/// each one serves.
public enum SocketActivation {
    /// First inherited fd (SD_LISTEN_FDS_START).
    public static let firstFD: Int32 = 3
    /// The listener name that selects the admin listener (`FileDescriptorName=admin`).
    public static let adminName = "admin"

    /// One fd passed by the service manager: its number, its name (LISTEN_FDNAMES; systemd's
    /// default is the socket unit's name) and the address it is bound to (getsockname).
    public struct Inherited: Sendable, Equatable, CustomStringConvertible {
        public var fd: Int32
        public var name: String?
        public var address: ListenAddress?
        public init(fd: Int32, name: String?, address: ListenAddress?) {
            self.fd = fd
            self.name = name
            self.address = address
        }
        public var description: String {
            "fd \(fd)" + (name.map { " '\($0)'" } ?? "") + " (\(address?.description ?? "unknown address"))"
        }
    }

    /// The variables read, or why they are ignored.
    public enum Parsed: Sendable, Equatable {
        /// No LISTEN_FDS or LISTEN_PID: not socket-activated.
        case none
        /// The fds `firstFD ..< firstFD + count`, with names when LISTEN_FDNAMES has one per fd.
        case fds([(fd: Int32, name: String?)], warning: String?)
        /// Variables present but not for us (LISTEN_PID of another process) or malformed.
        case ignored(String)

        public static func == (a: Parsed, b: Parsed) -> Bool {
            switch (a, b) {
            case (.none, .none): return true
            case (.ignored(let x), .ignored(let y)): return x == y
            case (.fds(let x, let wx), .fds(let y, let wy)):
                return wx == wy && x.count == y.count && zip(x, y).allSatisfy { $0.fd == $1.fd && $0.name == $1.name }
            default: return false
            }
        }
    }

    /// Reads LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES (pure).
    public static func parse(environment: [String: String], pid: Int32) -> Parsed {
        guard let countText = environment["LISTEN_FDS"], let pidText = environment["LISTEN_PID"] else { return .none }
        guard let listenPID = Int32(pidText), listenPID > 0 else { return .ignored("LISTEN_PID is not a process id: \(pidText)") }
        guard listenPID == pid else { return .ignored("LISTEN_PID \(listenPID) is not this process (\(pid))") }
        guard let count = Int32(countText), count >= 0, count <= 4096 else { return .ignored("LISTEN_FDS is not a count: \(countText)") }
        var names: [String?] = Array(repeating: nil, count: Int(count))
        var warning: String?
        if let namesText = environment["LISTEN_FDNAMES"] {
            let parts = namesText.split(separator: ":", omittingEmptySubsequences: false).map(String.init)
            if parts.count == Int(count) {
                names = parts.map { $0.isEmpty ? nil : $0 }
            } else {
                warning = "LISTEN_FDNAMES has \(parts.count) name(s) for \(count) fd(s); matching by address only"
            }
        }
        return .fds((0..<count).map { (fd: firstFD + $0, name: names[Int($0)]) }, warning: warning)
    }

    /// Which inherited fd each configured listener uses.
    public struct Plan: Sendable, Equatable {
        /// Per entry of `listeners` (same order): the inherited fd, or nil to bind as usual.
        public var listeners: [Int32?]
        /// The admin listener's inherited fd.
        public var admin: Int32?
        /// Inherited fds no listener wants: logged and closed by the caller.
        public var unmatched: [Inherited]
    }

    /// Pairs inherited fds with listeners (pure). First by name: an fd whose name is a
    /// listener's `name` (or `admin` for the admin listener) serves that listener. Then the rest
    /// by address: TCP host (compared numerically) and port, or the unix socket path. Each fd and
    /// each listener is used at most once.
    public static func match(_ inherited: [Inherited], listeners: [ListenerConfig], admin: ListenAddress?) -> Plan {
        var plan = Plan(listeners: Array(repeating: nil, count: listeners.count), admin: nil, unmatched: [])
        var rest: [Inherited] = []
        for s in inherited {
            if let name = s.name, let i = listeners.indices.first(where: { listeners[$0].name == name && plan.listeners[$0] == nil }) {
                plan.listeners[i] = s.fd
            } else if s.name == adminName, admin != nil, plan.admin == nil, !listeners.contains(where: { $0.name == adminName }) {
                plan.admin = s.fd
            } else {
                rest.append(s)
            }
        }
        for s in rest {
            guard let address = s.address else { plan.unmatched.append(s); continue }
            if let i = listeners.indices.first(where: { plan.listeners[$0] == nil && sameAddress(bound: address, configured: listeners[$0].address) }) {
                plan.listeners[i] = s.fd
            } else if let admin, plan.admin == nil, sameAddress(bound: address, configured: admin) {
                plan.admin = s.fd
            } else {
                plan.unmatched.append(s)
            }
        }
        return plan
    }

    /// Whether a socket bound to `bound` (as getsockname reports it: numeric host) serves the
    /// configured address. Hosts compare as addresses (`::1` = `0:0:0:0:0:0:0:1`); `localhost`
    /// matches either loopback address.
    public static func sameAddress(bound: ListenAddress, configured: ListenAddress) -> Bool {
        switch (bound, configured) {
        case (.unix(let a), .unix(let b)):
            return a == b
        case (.tcp(let h1, let p1), .tcp(let h2, let p2)):
            guard p1 == p2, let a = SocketAddress.numeric(h1, port: p1) else { return false }
            if let b = SocketAddress.numeric(h2, port: p2) { return a.family == b.family && a.host == b.host }
            if h2.lowercased() == "localhost" { return a.host == "127.0.0.1" || a.host == "::1" }
            return false
        default:
            return false
        }
    }

    /// The address a socket address denotes in configuration terms (numeric host, or unix path;
    /// an abstract unix name as `@name`).
    public static func listenAddress(_ a: SocketAddress) -> ListenAddress? {
        switch a.family {
        case AF_INET, AF_INET6:
            return .tcp(host: a.host, port: a.port)
        case AF_UNIX:
            return a.unixPath.map { .unix(path: $0) }
        default:
            return nil
        }
    }

    /// The inherited fds of this process: reads and unsets LISTEN_PID, LISTEN_FDS and
    /// LISTEN_FDNAMES (so nothing started later believes them), sets FD_CLOEXEC on every fd and
    /// asks each its address. Call once, before any other fd is opened by name.
    public static func takeFromEnvironment(logger: Logger) -> [Inherited] {
        var env: [String: String] = [:]
        for key in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
            if let v = getenv(key) { env[key] = String(cString: v) }
            unsetenv(key)
        }
        switch parse(environment: env, pid: getpid()) {
        case .none:
            return []
        case .ignored(let why):
            logger.warning("ignoring socket activation variables", metadata: ["reason": "\(why)"])
            return []
        case .fds(let fds, let warning):
            if let warning { logger.warning("socket activation: \(warning)") }
            return fds.map { fd, name in
                _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
                let address = Listener.boundAddress(fd: fd).flatMap(listenAddress)
                return Inherited(fd: fd, name: name, address: address)
            }
        }
    }
}

// MARK: - Notifications

/// Sends sd_notify datagrams to one socket. Owns a close-on-exec, non-blocking AF_UNIX datagram
/// socket (guarded by `lock`); a message that cannot be sent is dropped and logged at debug
/// level (systemd's own sd_notify gives up the same way).
public final class SystemdNotifier: @unchecked Sendable {  // @unchecked: `fd` is immutable after init, sends serialised by `lock`
    public let address: NotifySocketAddress
    private let socketAddress: SocketAddress
    private let fd: Int32
    private let lock = Lock()
    private let logger: Logger

    /// nil when $NOTIFY_SOCKET is unset or unusable (logged).
    public init?(environment: [String: String], logger: Logger) {
        guard let raw = environment["NOTIFY_SOCKET"], !raw.isEmpty else { return nil }
        guard let address = NotifySocketAddress.parse(raw), let socketAddress = address.socketAddress else {
            logger.warning("ignoring NOTIFY_SOCKET: not an absolute path or @abstract name", metadata: ["value": "\(raw)"])
            return nil
        }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else {
            logger.warning("cannot create the systemd notification socket", metadata: ["error": "\(IOError("socket", errno))"])
            return nil
        }
        self.address = address
        self.socketAddress = socketAddress
        self.fd = fd
        self.logger = logger
    }

    deinit { close(fd) }

    /// Sends one message (`KEY=VALUE` lines); false if it could not be sent.
    @discardableResult
    public func send(_ fields: [(String, String)]) -> Bool {
        let text = SystemdMessage.text(fields)
        let sent: Int = lock.withLock {
            Array(text.utf8).withUnsafeBytes { buf in
                socketAddress.withSockAddr { sa, len in sendto(fd, buf.baseAddress, buf.count, 0, sa, len) }
            }
        }
        if sent < 0 {
            logger.debug("systemd notification not sent", metadata: ["error": "\(IOError("sendto", errno))"])
            return false
        }
        return true
    }
}

/// What a session lacks at readiness time: its name and why (the last failure detail, which
/// never holds a secret), for STATUS=.
public struct SessionShortfall: Sendable, Equatable {
    public var session: String
    public var detail: String?
    public init(session: String, detail: String?) {
        self.session = session
        self.detail = detail
    }
}

/// STATUS= texts (pure).
public enum SystemdStatus {
    static func listening(_ listeners: [String]) -> String {
        "listening on " + (listeners.isEmpty ? "nothing" : listeners.joined(separator: ", "))
    }

    static func missing(_ shortfalls: [SessionShortfall]) -> String {
        shortfalls.map { s in "\(s.session) (\(s.detail ?? "first token request not answered yet"))" }.joined(separator: ", ")
    }

    /// While waiting for the first tokens.
    public static func starting(listeners: [String], waitingFor: [SessionShortfall]) -> String {
        "Starting: \(listening(listeners)); waiting for the first token of: " + waitingFor.map(\.session).joined(separator: ", ")
    }

    /// At READY=1 and afterwards: every session has a token, or which do not and why.
    public static func serving(listeners: [String], sessions: Int, shortfalls: [SessionShortfall], timedOut: Bool = false) -> String {
        var s = "Serving: \(listening(listeners)); "
        if shortfalls.isEmpty {
            s += sessions == 0 ? "no sessions" : "\(sessions == 1 ? "the session holds" : "all \(sessions) sessions hold") a token"
        } else {
            s += (timedOut ? "startup timeout; " : "") + "no token for: " + missing(shortfalls)
                + " (their routes answer 503 until a token is obtained)"
        }
        return s
    }
}

/// The link to systemd for `bearerd run`: readiness, status, reload and stop notifications, and
/// the watchdog.
///
/// Owns the notifier, its serial `queue` and the state below, which is touched only on `queue`
/// (public methods hop there synchronously, so a message is sent before they return; they must
/// not be called from `queue`). Invariants: READY=1 is sent at most once before any reload, and
/// never after STOPPING=1; WATCHDOG=1 is sent only when every loop answered the previous ping.
public final class SystemdService: @unchecked Sendable {  // @unchecked: mutable state confined to `queue`
    /// Facts about the running server the service reports on. `shortfalls` names the sessions
    /// without a token now; `listeners` describes the listening addresses.
    public struct Probe: Sendable {
        public var listeners: @Sendable () -> [String]
        public var sessionCount: @Sendable () -> Int
        public var shortfalls: @Sendable () -> [SessionShortfall]
        public var loops: [EventLoop]
        public init(listeners: @escaping @Sendable () -> [String], sessionCount: @escaping @Sendable () -> Int,
                    shortfalls: @escaping @Sendable () -> [SessionShortfall], loops: [EventLoop]) {
            self.listeners = listeners
            self.sessionCount = sessionCount
            self.shortfalls = shortfalls
            self.loops = loops
        }
    }

    private enum Phase { case created, starting, ready, stopping }

    public let notifier: SystemdNotifier
    private let queue = DispatchQueue(label: "bearerd.systemd")
    private let logger: Logger
    private let watchdogPeriod: Duration?
    private var phase = Phase.created
    private var probe: Probe?
    private var lastStatus: String?
    private var timerSerial: UInt64 = 0
    /// Watchdog: when the last ping was sent, and each loop's last answer (guarded by `pongLock`).
    private var lastPing: UInt64 = 0
    private let pongLock = Lock()
    private var pongs: [UInt64] = []
    private var loopsWedged = false

    /// How often the STATUS= summary is recomputed once ready, and readiness polled before.
    /// Set before `started` (read on `queue` afterwards).
    public var statusInterval: Duration = .seconds(1)
    public var readinessPollInterval: Duration = .milliseconds(50)

    /// nil when $NOTIFY_SOCKET is unset (not started by systemd, or Type=simple).
    public init?(environment: [String: String] = ProcessInfo.processInfo.environment, pid: Int32 = getpid(), logger: Logger) {
        guard let notifier = SystemdNotifier(environment: environment, logger: logger) else { return nil }
        self.notifier = notifier
        self.logger = logger
        let watchdog = SystemdWatchdog.setting(environment: environment, pid: pid)
        watchdogPeriod = watchdog?.period
        if let watchdog, watchdog.clamped {
            logger.warning("WATCHDOG_USEC is very large; sending WATCHDOG=1 every hour instead of every half timeout",
                           metadata: ["watchdog_usec": "\(watchdog.timeoutMicroseconds)"])
        }
    }

    /// Start failed (bind error, bad secret): STATUS= with the reason; systemd sees the exit.
    public func startFailed(_ reason: String) {
        queue.sync { _ = notifier.send([("STATUS", "Failed to start: \(reason)")]) }
    }

    /// Listeners are bound: starts the watchdog and waits for every session's first token, then
    /// READY=1 (or after `startupTimeout`, READY=1 with the sessions still missing one).
    public func started(probe: Probe, startupTimeout: Duration) {
        queue.sync {
            guard phase == .created else { return }
            self.probe = probe
            phase = .starting
            startWatchdog()
            let deadline = monotonicNanos() &+ min(startupTimeout.nanoseconds, UInt64(Int64.max))  // No wrap: uptime < 2^63 ns.
            let missing = probe.shortfalls()
            if missing.isEmpty {
                becomeReady(timedOut: false)
            } else {
                send([("STATUS", SystemdStatus.starting(listeners: probe.listeners(), waitingFor: missing))])
                pollReadiness(deadline: deadline)
            }
        }
    }

    /// SIGHUP received: RELOADING=1 (with MONOTONIC_USEC, which systemd ≥ 253 wants) once ready;
    /// only a STATUS= while still starting.
    public func reloading() {
        queue.sync {
            switch phase {
            case .ready:
                send([("RELOADING", "1"), ("MONOTONIC_USEC", "\(monotonicNanos() / 1000)"), ("STATUS", "Reloading the configuration")])
            case .starting:
                send([("STATUS", "Reloading the configuration (still starting)")])
            case .created, .stopping:
                break
            }
        }
    }

    /// The reload finished; `failure` is its first error (the old configuration keeps running).
    public func reloaded(failure: String?) {
        queue.sync {
            guard phase == .ready || phase == .starting, let probe else { return }
            var fields: [(String, String)] = []
            if phase == .ready { fields.append(("READY", "1")) }
            let status: String
            if let failure {
                status = "Reload failed, still running the previous configuration: \(failure)"
            } else if phase == .ready {
                status = SystemdStatus.serving(listeners: probe.listeners(), sessions: probe.sessionCount(), shortfalls: probe.shortfalls())
            } else {
                status = SystemdStatus.starting(listeners: probe.listeners(), waitingFor: probe.shortfalls())
            }
            fields.append(("STATUS", status))
            lastStatus = failure == nil ? status : nil
            send(fields)
        }
    }

    /// SIGTERM/SIGINT: STOPPING=1; no READY=1 or status updates after this.
    public func stopping(grace: Duration) {
        queue.sync {
            guard phase != .stopping else { return }
            phase = .stopping
            timerSerial &+= 1
            send([("STOPPING", "1"), ("STATUS", "Stopping: finishing requests in flight (grace \(grace))")])
            // The watchdog keeps ticking (its own timer): a drain that wedges a loop still gets the
            // process restarted.
        }
    }

    // MARK: queue only

    private func send(_ fields: [(String, String)]) {
        if let status = fields.first(where: { $0.0 == "STATUS" }) {
            logger.debug("systemd notification", metadata: ["status": "\(status.1)"])
        }
        notifier.send(fields)
    }

    private func pollReadiness(deadline: UInt64) {
        let serial = timerSerial
        queue.asyncAfter(deadline: .now() + .nanoseconds(Int(clamping: readinessPollInterval.nanoseconds))) { [self] in
            guard serial == timerSerial, phase == .starting, let probe else { return }
            if probe.shortfalls().isEmpty {
                becomeReady(timedOut: false)
            } else if monotonicNanos() >= deadline {
                becomeReady(timedOut: true)
            } else {
                pollReadiness(deadline: deadline)
            }
        }
    }

    private func becomeReady(timedOut: Bool) {
        guard let probe else { return }
        phase = .ready
        let shortfalls = probe.shortfalls()
        let status = SystemdStatus.serving(listeners: probe.listeners(), sessions: probe.sessionCount(),
                                           shortfalls: shortfalls, timedOut: timedOut)
        if timedOut {
            logger.warning("startup timeout: reporting ready without every session's first token",
                           metadata: ["sessions": "\(shortfalls.map(\.session).joined(separator: ","))"])
        }
        lastStatus = status
        send([("READY", "1"), ("STATUS", status)])
        scheduleStatusRefresh()
    }

    /// Once ready: a new STATUS= whenever the summary changes (a session losing or regaining its token).
    private func scheduleStatusRefresh() {
        let serial = timerSerial
        queue.asyncAfter(deadline: .now() + .nanoseconds(Int(clamping: statusInterval.nanoseconds))) { [self] in
            guard serial == timerSerial, phase == .ready, let probe else { return }
            let status = SystemdStatus.serving(listeners: probe.listeners(), sessions: probe.sessionCount(), shortfalls: probe.shortfalls())
            if status != lastStatus {
                lastStatus = status
                send([("STATUS", status)])
            }
            scheduleStatusRefresh()
        }
    }

    private func startWatchdog() {
        guard let watchdogPeriod, let probe else { return }
        logger.info("systemd watchdog enabled", metadata: ["interval": "\(watchdogPeriod)"])
        pongLock.withLock { pongs = Array(repeating: 0, count: probe.loops.count) }
        send([("WATCHDOG", "1")])
        pingLoops()
        scheduleWatchdog()
    }

    private func scheduleWatchdog() {
        guard let watchdogPeriod else { return }
        queue.asyncAfter(deadline: .now() + .nanoseconds(Int(clamping: watchdogPeriod.nanoseconds))) { [self] in
            watchdogTick()
        }
    }

    /// One watchdog period: WATCHDOG=1 only if every loop answered the last ping, then ping again.
    private func watchdogTick() {
        let answers = pongLock.withLock { pongs }
        let late = answers.indices.filter { answers[$0] < lastPing }
        if late.isEmpty {
            if loopsWedged {
                loopsWedged = false
                logger.notice("every event loop answers again; watchdog pings resumed")
            }
            send([("WATCHDOG", "1")])
        } else if !loopsWedged {
            loopsWedged = true
            logger.error("event loop(s) not answering; withholding WATCHDOG=1 so systemd restarts bearerd",
                         metadata: ["loops": "\(late.map(String.init).joined(separator: ","))"])
            send([("STATUS", "Event loop(s) \(late.map(String.init).joined(separator: ",")) not answering; watchdog pings withheld")])
        }
        pingLoops()
        // Keep ticking in every phase: STOPPING still needs the loops alive to drain.
        scheduleWatchdog()
    }

    private func pingLoops() {
        guard let probe else { return }
        lastPing = monotonicNanos()
        for (i, loop) in probe.loops.enumerated() {
            loop.execute { [self] in
                let now = monotonicNanos()
                pongLock.withLock { pongs[i] = now }
            }
        }
    }
}
