/// The process's client-connection budget (`DescriptorBudget`) shared by every listener:
/// listeners ask it before each accept(2), accepted connections give their slot back when their
/// descriptor is closed (`SocketChannel.onDescriptorClosed`, or `release()` by whoever closes
/// an accepted fd without a channel).
///
/// Owns, under `lock`: the budget value and the listeners it paused. Listeners are paused on
/// their accepting loop by themselves (`Listener.acceptOne`); a release, on any loop, resumes
/// them by hopping onto their loop. `events` is set once, before any listener uses the budget,
/// and is called outside the lock, on whatever thread caused the event.
public final class AcceptBudget: @unchecked Sendable {  // @unchecked: mutable state guarded by `lock`
    private let lock = Lock()
    private var budget = DescriptorBudget()
    private var paused: [Listener] = []
    /// What an operator is told, once per streak (set before the listeners start).
    public var events: (@Sendable (Event) -> Void)?

    public enum Event: Sendable {
        /// Accepting paused at the budget: `open` client connections, `budget` allowed, `limit` RLIMIT_NOFILE.
        case pausedAtBudget(open: Int, budget: Int, limit: Int)
        /// The refusal streak is over: `refused` pauses during it.
        case streakEnded(refused: UInt64, open: Int, budget: Int)
        /// accept(2) failed for lack of descriptors although the budget had room.
        case outOfDescriptors(errno: Int32, budget: Int, limit: Int)
    }

    /// The counters and gauges `/metrics` shows.
    public struct Snapshot: Sendable, Equatable {
        public var limit: Int
        public var budget: Int
        public var open: Int
        public var pausesAtBudget: UInt64
        public var outOfDescriptors: UInt64
        public var paused: Bool
    }

    public init() {}

    public var snapshot: Snapshot {
        lock.withLock {
            Snapshot(limit: budget.limit, budget: budget.connections, open: budget.open, pausesAtBudget: budget.refusals,
                     outOfDescriptors: budget.outOfDescriptors, paused: budget.paused)
        }
    }

    /// Sets (or, on reload, resets) the budget from the descriptor limit, the descriptors in use
    /// at start and the reserve (`DescriptorBudget.reserve`).
    public func configure(limit: Int, inUse: Int, reserve: Int) {
        let toResume: [Listener] = lock.withLock {
            guard budget.configure(limit: limit, inUse: inUse, reserve: reserve) else { return [] }
            defer { paused = [] }
            return paused
        }
        for l in toResume { l.resumeFromBudget() }
    }

    /// A listener about to accept: true to go on (a slot is held for the connection), false
    /// when it must pause (it is resumed by a later release).
    func admit(_ listener: Listener) -> Bool {
        let (decision, state) = lock.withLock { () -> (DescriptorBudget.Admission, DescriptorBudget) in
            let d = budget.admit()
            if case .pause = d, !paused.contains(where: { $0 === listener }) { paused.append(listener) }
            return (d, budget)
        }
        if case .pause(let starts) = decision {
            if starts { events?(.pausedAtBudget(open: state.open, budget: state.connections, limit: state.limit)) }
            return false
        }
        return true
    }

    /// A slot `admit` held that no connection took.
    func cancel() { settle { $0.cancel() } }

    /// A connection was accepted (ends an out-of-descriptors streak).
    func accepted() { lock.withLock { budget.accepted() } }

    /// accept(2) failed with EMFILE/ENFILE.
    func ranOutOfDescriptors(_ e: Int32) {
        let (starts, state) = lock.withLock { (budget.ranOutOfDescriptors(), budget) }
        if starts { events?(.outOfDescriptors(errno: e, budget: state.connections, limit: state.limit)) }
    }

    /// An accepted connection's descriptor was closed. Any thread.
    public func release() { settle { $0.release() } }

    /// Gives a slot back; resumes the paused listeners (taken under the same lock hold, so a
    /// listener paused after this release waits for the next one) and reports a streak's end.
    private func settle(_ change: (inout DescriptorBudget) -> DescriptorBudget.Release) {
        let (r, state, toResume) = lock.withLock { () -> (DescriptorBudget.Release, DescriptorBudget, [Listener]) in
            let r = change(&budget)
            guard r.resume else { return (r, budget, []) }
            defer { paused = [] }
            return (r, budget, paused)
        }
        for l in toResume { l.resumeFromBudget() }
        if r.endsStreak { events?(.streakEnded(refused: state.streakRefusals, open: state.open, budget: state.connections)) }
    }
}
