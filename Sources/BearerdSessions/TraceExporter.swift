import BearerdConfig
import BearerdIO
import BearerdOAuth
import BearerdProxyCore
import BearerdTLS
import Logging
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Exports finished spans over OTLP/HTTP (protobuf) to `tracing.otlp_endpoint`
/// (docs/architecture.md §2.9), never on a proxy loop's path.
///
/// Owns a bounded queue of `SpanRecord`s (any thread, under `state`'s lock: `submit` appends or,
/// when full, drops and counts the drop) and its own `EventLoop`, where batches are encoded
/// (`OTLPEncoding`) and posted with bearerd's own HTTP client (`TokenEndpointClient`). A batch
/// leaves at `batchSize` spans or every `interval`, one request at a time; a failed export
/// (transport, 429, 5xx) is retried at most `maxAttempts - 1` times after a short backoff, then
/// its spans are dropped and counted. Invariant: the queue never holds more than `capacity`
/// spans, so a dead collector costs bounded memory and nothing else.
public final class TraceExporter: @unchecked Sendable {  // @unchecked: mutable state under `state` or on `loop`
    public static let capacity = 4096
    public static let batchSize = 512
    public static let interval: Duration = .seconds(1)
    public static let maxAttempts = 3
    public static let requestTimeout: Duration = .seconds(5)

    /// What /metrics shows (`bearerd_trace_*`).
    public struct Counters: Sendable, Equatable {
        public var exported: UInt64 = 0
        public var droppedQueueFull: UInt64 = 0
        public var droppedExportFailed: UInt64 = 0
        public var exportsFailed: UInt64 = 0
        public var retries: UInt64 = 0
        public var queued: UInt64 = 0
    }

    private struct State {
        var queue: [SpanRecord] = []
        var counters = Counters()
        /// A flush is already on its way to the loop (size trigger).
        var kicked = false
    }
    private let state = Mutex(State())

    let endpoint: EndpointURL
    private let headers: [(name: String, value: String)]
    private let tls: TLSContext?
    private let logger: Logger
    private let resource: [TraceAttribute]
    /// Unix ns minus monotonic ns, read once (spans carry monotonic times).
    private let wallOffset: Int64
    let loop: EventLoop

    // Loop only.
    private var exporting = false
    private var stopped = false
    private var lastFailureLogged: UInt64 = 0

    init(endpoint: EndpointURL, headers: [(name: String, value: String)], tls: TLSContext?, logger: Logger, serviceName: String) {
        self.endpoint = endpoint
        self.headers = [("Content-Type", "application/x-protobuf")] + headers
        self.tls = tls
        self.logger = logger
        resource = [TraceAttribute("service.name", serviceName), TraceAttribute("service.version", BearerdVersion.string)]
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        let wall = Int64(ts.tv_sec) &* 1_000_000_000 &+ Int64(ts.tv_nsec)
        wallOffset = wall &- Int64(clamping: monotonicNanos())
        loop = EventLoop(index: 20_000, readBufferSize: 16 * 1024)
    }

    /// Starts the periodic flush.
    public func start() {
        loop.execute { [self] in tick() }
    }

    /// Stops exporting (what is queued is dropped uncounted: the process is ending).
    public func stop() {
        loop.execute { [self] in stopped = true }
    }

    public var counters: Counters {
        state.withLock { s in
            var c = s.counters
            c.queued = UInt64(s.queue.count)
            return c
        }
    }

    /// Hands a finished span over (any thread; a lock and an append). Full queue: dropped, counted.
    public func submit(_ span: SpanRecord) {
        let kick = state.withLock { s -> Bool in
            guard s.queue.count < Self.capacity else {
                s.counters.droppedQueueFull &+= 1
                return false
            }
            s.queue.append(span)
            guard s.queue.count >= Self.batchSize, !s.kicked else { return false }
            s.kicked = true
            return true
        }
        if kick { loop.execute { [self] in flush() } }
    }

    private func tick() {
        guard !stopped else { return }
        flush()
        loop.schedule(after: Self.interval) { [self] in tick() }
    }

    /// Sends the next batch unless one is on its way.
    private func flush() {
        guard !exporting, !stopped else { return }
        let batch = state.withLock { s -> [SpanRecord] in
            s.kicked = false
            let n = min(s.queue.count, Self.batchSize)
            let b = Array(s.queue.prefix(n))
            s.queue.removeFirst(n)
            return b
        }
        guard !batch.isEmpty else { return }
        let body = OTLPEncoding.exportRequest(batch, resource: resource, scopeName: "bearerd", scopeVersion: BearerdVersion.string,
                                              wallOffset: wallOffset)
        exporting = true
        send(body, spans: batch.count, attempt: 1)
    }

    private func send(_ body: [UInt8], spans: Int, attempt: Int) {
        let request = EncodedTokenRequest(body: body, headers: headers)
        let client = TokenEndpointClient.post(request, to: endpoint, tls: tls, on: loop) { [self] outcome in
            let failure: String?
            switch outcome {
            case .response(let status, _, _) where (200..<300).contains(status):
                failure = nil
            case .response(let status, _, _) where status == 429 || status == 502 || status == 503 || status == 504:
                failure = "status \(status)"
            case .response(let status, _, _):
                // Refused for good (400: malformed, 401/403: the headers_file's key): not retried.
                done(spans: spans, failure: "status \(status)")
                return
            case .tooLarge(let status):
                failure = (200..<300).contains(status) ? nil : "status \(status)"
            case .transportFailure(let detail, _):
                failure = detail
            }
            guard let failure else {
                done(spans: spans, failure: nil)
                return
            }
            guard attempt < Self.maxAttempts, !stopped else {
                done(spans: spans, failure: failure)
                return
            }
            state.withLock { $0.counters.retries &+= 1 }
            loop.schedule(after: .milliseconds(250 << min(attempt, 4))) { [self] in
                send(body, spans: spans, attempt: attempt + 1)
            }
        }
        loop.schedule(after: Self.requestTimeout) { [weak client] in
            client?.cancel(detail: "no answer within \(Self.requestTimeout)")
        }
    }

    private func done(spans: Int, failure: String?) {
        exporting = false
        state.withLock { s in
            if failure == nil {
                s.counters.exported &+= UInt64(spans)
            } else {
                s.counters.exportsFailed &+= 1
                s.counters.droppedExportFailed &+= UInt64(spans)
            }
        }
        if let failure {
            // At most one line a minute: a dead collector must not flood the log.
            let now = monotonicNanos()
            if lastFailureLogged == 0 || now &- lastFailureLogged >= 60_000_000_000 {
                lastFailureLogged = now
                logger.warning("trace export failed; spans dropped", metadata: [
                    "otlp_endpoint": "\(endpoint)", "spans": "\(spans)", "error": "\(failure)"])
            }
        }
        let more = state.withLock { $0.queue.count >= Self.batchSize }
        if more { flush() }
    }
}
