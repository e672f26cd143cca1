/// The rejection breaker of docs/architecture.md §6: it guards against an upstream that rejects *every*
/// token (wrong audience, clock skew, a misrouted request), never against revocation. Only
/// refreshes forced by the rejection of a token that was never *proven* (never answered by an
/// upstream with a status that is not a rejection) are admitted here; more than
/// `maxForcedRefreshes` of them within `window` stop further such refreshes for `openDuration`
/// (the upstream's rejections are then passed through: they are not about our token). A
/// proven token's rejection never reaches the breaker (`TokenSession.StateMachine`).
///
/// Owns the instants (and token generations) of the recent counted refreshes and the open
/// deadline. Pure; the clock is a parameter. Invariant: `recent` holds at most
/// `maxForcedRefreshes` entries, all within `window` of the last admission.
public struct RejectionBreaker: Sendable, Equatable {
    public struct Configuration: Sendable, Equatable {
        /// Counted forced refreshes allowed per window. 5.
        public var maxForcedRefreshes: Int = 5
        /// 30 s.
        public var window: Duration = .seconds(30)
        /// 30 s.
        public var openDuration: Duration = .seconds(30)
        public init() {}
    }

    public enum Decision: Sendable, Equatable {
        /// Go ahead and force a refresh (recorded).
        case allowed
        /// This request would be one too many: the breaker opens now until `until`. Log an error.
        case tripped(until: MonotonicInstant)
        /// The breaker is open: pass the rejection through.
        case open(until: MonotonicInstant)
    }

    struct Entry: Sendable, Equatable {
        var at: MonotonicInstant
        var generation: UInt64
    }

    public let configuration: Configuration
    private var recent: [Entry] = []
    private var openUntil: MonotonicInstant?

    public init(configuration: Configuration = .init()) { self.configuration = configuration }

    /// Asks to force one refresh at `now` for the rejection of the never-proven `generation`;
    /// records it when allowed.
    public mutating func admitForcedRefresh(at now: MonotonicInstant, generation: UInt64 = 0) -> Decision {
        if let until = openUntil {
            if now < until { return .open(until: until) }
            openUntil = nil
        }
        recent.removeAll { now - $0.at >= configuration.window }
        if recent.count >= configuration.maxForcedRefreshes {
            let until = now + configuration.openDuration
            openUntil = until
            recent.removeAll()
            return .tripped(until: until)
        }
        recent.append(Entry(at: now, generation: generation))
        return .allowed
    }

    /// `generation` turned out proven after its rejection was counted (a success that was
    /// reported after the rejection): that refresh was a revocation's, not the breaker's business.
    public mutating func forgive(generation: UInt64) {
        recent.removeAll { $0.generation == generation }
    }

    public func isOpen(at now: MonotonicInstant) -> Bool {
        if let until = openUntil { return now < until }
        return false
    }

    /// Refreshes counted now (for tests).
    public var countedRefreshes: Int { recent.count }

    /// Forgets history (configuration reload).
    public mutating func reset() {
        recent.removeAll()
        openUntil = nil
    }
}
