/// How many client connections bearerd holds open at once, derived from its descriptor limit
/// (haproxy derives `maxconn` from `ulimit -n` the same way), and whether accepting is paused.
///
/// A value with no I/O: `AcceptBudget` keeps one under its lock and runs the listeners' pauses
/// and resumptions it decides. Every proxied client needs a second descriptor for its upstream
/// connection, so the budget is half of what the limit leaves after the descriptors open at
/// start and a reserve for everything else bearerd opens (a reload's config and secret files
/// and new listeners, token endpoint and Redis connections, state and sink files, the DPoP key):
/// accepting never eats that reserve.
///
/// Invariants: `open` ≥ 0 (a release never takes it below); `paused` only while `open` ≥
/// `connections` was seen at an admission; a refusal streak (`inStreak`) starts with the first
/// refusal after accepting freely and ends only once `open` falls to `lowWater`, so a budget
/// that flaps by one connection logs once, not once per connection.
public struct DescriptorBudget: Sendable, Equatable {
    /// The soft RLIMIT_NOFILE in force.
    public private(set) var limit: Int
    /// Client connections allowed open at once (≥ 1). `Int.max` until configured.
    public private(set) var connections: Int
    /// Client connections open now (admitted and not yet released).
    public private(set) var open = 0
    /// Accepting stopped because `open` reached `connections`.
    public private(set) var paused = false
    /// A refusal streak is running (see the type's invariants).
    public private(set) var inStreak = false
    /// Times accepting paused at the budget (each pause declines the connections waiting).
    public private(set) var refusals: UInt64 = 0
    /// Refusals in the current or last streak (for the line that ends it).
    public private(set) var streakRefusals: UInt64 = 0
    /// Times an accept failed with EMFILE/ENFILE (descriptors taken by something outside the budget).
    public private(set) var outOfDescriptors: UInt64 = 0
    /// An out-of-descriptors streak is running (until the next accepted connection).
    public private(set) var inOutOfDescriptorsStreak = false

    /// Unlimited: every admission succeeds until `configure` is called.
    public init() {
        limit = Int.max
        connections = Int.max
    }

    public init(limit: Int, inUse: Int, reserve: Int) {
        self.init()
        configure(limit: limit, inUse: inUse, reserve: reserve)
    }

    /// Descriptors kept out of the budget besides those open at start: 16 for the process (a
    /// reload's config and secret files, logs, the systemd notify socket, a signal's work), and
    /// per session 4 (its token endpoint connection, a Redis connection, a state or sink file,
    /// its DPoP key or client assertion key), and per listener 2 (a reload binds a moved
    /// listener before the old one closes).
    public static func reserve(sessions: Int, listeners: Int) -> Int {
        let s = max(0, min(sessions, 1 << 20))
        let l = max(0, min(listeners, 1 << 20))
        return 16 + 4 * s + 2 * l
    }

    /// Sets the budget: half of `limit` − `inUse` − `reserve` (each client may hold an upstream
    /// connection too), at least 1 (a limit too low to serve still serves one client at a time).
    /// Connections open now stay counted. True when accepting was paused and the new budget
    /// has room (resume the paused listeners).
    @discardableResult
    public mutating func configure(limit: Int, inUse: Int, reserve: Int) -> Bool {
        let l = max(0, limit)
        self.limit = l
        let free = l.subtractingReportingOverflow(max(0, inUse)).partialValue
        let left = free.subtractingReportingOverflow(max(0, reserve)).partialValue
        connections = max(1, left / 2)
        guard paused && open < connections else { return false }
        paused = false
        return true
    }

    /// At this many open connections a refusal streak ends: a tenth of the budget (at least two
    /// connections, so one closing and one more arriving never ends it) under it, at least 0.
    public var lowWater: Int {
        guard connections != Int.max else { return Int.max }
        return max(0, connections - max(2, connections / 10))
    }

    /// What a listener about to accept does.
    public enum Admission: Sendable, Equatable {
        /// Take one connection; its slot is counted (give it back with `cancel` if none was taken).
        case accept
        /// At the budget: stop accepting until a release resumes it. `startsStreak`: the first
        /// refusal since accepting freely (log it).
        case pause(startsStreak: Bool)
    }

    /// A listener whose socket is readable asks before accept(2).
    public mutating func admit() -> Admission {
        if !paused && open < connections {
            open += 1
            return .accept
        }
        paused = true
        refusals &+= 1
        let starts = !inStreak
        if starts {
            inStreak = true
            streakRefusals = 0
        }
        streakRefusals &+= 1
        return .pause(startsStreak: starts)
    }

    /// An admitted slot no connection took (the backlog was empty, or accept(2) failed).
    public mutating func cancel() -> Release {
        release()
    }

    /// What a connection's close changed.
    public struct Release: Sendable, Equatable {
        /// Accepting was paused and may go on: resume the paused listeners.
        public var resume: Bool
        /// The refusal streak ended (log it, with `streakRefusals`).
        public var endsStreak: Bool
    }

    /// A client connection's descriptor was closed.
    public mutating func release() -> Release {
        if open > 0 { open -= 1 }
        var r = Release(resume: false, endsStreak: false)
        if paused && open < connections {
            paused = false
            r.resume = true
        }
        if inStreak && !paused && open <= lowWater {
            inStreak = false
            r.endsStreak = true
        }
        return r
    }

    /// accept(2) failed with EMFILE or ENFILE; whether this starts a streak (log it).
    public mutating func ranOutOfDescriptors() -> Bool {
        outOfDescriptors &+= 1
        defer { inOutOfDescriptorsStreak = true }
        return !inOutOfDescriptorsStreak
    }

    /// A connection was accepted: an out-of-descriptors streak is over.
    public mutating func accepted() {
        inOutOfDescriptorsStreak = false
    }
}
