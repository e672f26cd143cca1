import BearerdIO
import BearerdOAuth
import Synchronization

/// What one token session publishes for other threads: the current token for the loops' fast
/// path, and what the admin endpoints and `bearerd check` read (status, expiry, waiter count,
/// last failure, counters).
///
/// Written only by the session's queue; read from any thread. Everything is under `lock`, and
/// `version` is bumped (releasing) after every change of the token, so a loop that cached the
/// token with the version it read it at knows, with one atomic load and no lock, whether its copy
/// is still the published one (`LoopContext.usableToken(route:of:session:now:)`).
final class TokenPublication: @unchecked Sendable {  // @unchecked: `state` guarded by `lock`, `version` atomic
    struct State {
        var token: PublishedToken?
        /// Generation of the published token (0 before the first).
        var generation: UInt64 = 0
        var status: TokenSession.Status = .idle
        /// Monotonic nanoseconds at which the published token expires.
        var expiresAt: UInt64?
        var waiters = 0
        /// The last token request failure's detail (scrubbed); nil once a token was obtained since.
        var failure: String?
        /// Why the newest refresh token is only in memory (a state file write failed); nil once on disk.
        var persistFailure: String?
        var counters = SessionMetrics()
    }

    private let lock = Lock()
    private var state = State()
    private let version = Atomic<UInt64>(0)

    /// One consistent read.
    func read<T>(_ body: (State) -> T) -> T { lock.withLock { body(state) } }

    /// Changes anything but the token (use `publish` for that).
    func update(_ body: (inout State) -> Void) { lock.withLock { body(&state) } }

    /// Publishes a new token (nil: none usable), then bumps the version.
    func publish(_ token: PublishedToken?, expiresAt: UInt64?) {
        lock.withLock {
            state.token = token
            state.expiresAt = expiresAt
            if let token { state.generation = token.generation }
        }
        version.wrappingAdd(1, ordering: .releasing)
    }

    var token: PublishedToken? { read { $0.token } }

    /// Moves after every `publish`. Lock-free.
    @inline(__always)
    var currentVersion: UInt64 { version.load(ordering: .acquiring) }
}
