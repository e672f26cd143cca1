/// The rejection breaker of DESIGN §6: more than `maxForcedRefreshes` rejection-triggered
/// refreshes within `window` stop further forced refreshes for `openDuration` (the
/// upstream's rejections are then passed through: they are not about our token).
///
/// Owns the instants of the recent forced refreshes and the open deadline. Pure; the clock
/// is a parameter. Invariant: `recent` holds at most `maxForcedRefreshes` instants, all within
/// `window` of the last admission.
public struct RejectionBreaker: Sendable, Equatable {
    public struct Configuration: Sendable, Equatable {
        /// Forced refreshes allowed per window. 5.
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

    public let configuration: Configuration
    private var recent: [MonotonicInstant] = []
    private var openUntil: MonotonicInstant?

    public init(configuration: Configuration = .init()) { self.configuration = configuration }

    /// Asks to force one refresh at `now`; records it when allowed.
    public mutating func admitForcedRefresh(at now: MonotonicInstant) -> Decision {
        if let until = openUntil {
            if now < until { return .open(until: until) }
            openUntil = nil
        }
        recent.removeAll { now - $0 >= configuration.window }
        if recent.count >= configuration.maxForcedRefreshes {
            let until = now + configuration.openDuration
            openUntil = until
            recent.removeAll()
            return .tripped(until: until)
        }
        recent.append(now)
        return .allowed
    }

    public func isOpen(at now: MonotonicInstant) -> Bool {
        if let until = openUntil { return now < until }
        return false
    }

    /// Forgets history (configuration reload).
    public mutating func reset() {
        recent.removeAll()
        openUntil = nil
    }
}
