import BearerdHTTP
import BearerdIO
import BearerdProxyCore
import BearerdSessions

/// Serves requests for local endpoints (admin, demo upstream) instead of proxying them.
public protocol LocalResponder: AnyObject, Sendable {
    /// Answers a complete request (body collected up to 1 MiB). Runs on the connection's loop.
    func respond(to head: HTTPRequestHead, body: [UInt8], loop: EventLoop, reply: @escaping (HTTPResponseHead, [UInt8]) -> Void)
    /// false: a request with a body is answered 413 at its head, before any of the body is read
    /// (no `100 Continue`), and the connection closes. Default true.
    var acceptsRequestBody: Bool { get }
}

extension LocalResponder {
    public var acceptsRequestBody: Bool { true }
}

/// What the admin endpoints read from the running server (implemented by `BearerdServer`),
/// so this module does not depend on the proxy. Any thread.
public protocol AdminStatusSource: AnyObject, Sendable {
    /// Where the server is in its life (`/readyz`).
    var lifecyclePhase: ServerLifecycle.Phase { get }
    /// The sessions whose snapshots `/readyz` and `/metrics` report.
    var sessions: SessionManager { get }
    /// Sums every loop's counters and gauges; `completion` runs once, on any thread.
    func collectMetrics(completion: @escaping @Sendable (LoopMetrics) -> Void)
    /// The client-connection budget's counters (nil: none kept).
    var acceptBudgetSnapshot: AcceptBudget.Snapshot? { get }
}

extension AdminStatusSource {
    public var acceptBudgetSnapshot: AcceptBudget.Snapshot? { nil }
}
