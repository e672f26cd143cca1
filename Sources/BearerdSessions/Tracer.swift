import BearerdConfig
import BearerdHTTP
import BearerdIO
import BearerdOAuth
import BearerdProxyCore
import BearerdTLS
import Logging
import Synchronization

/// OpenTelemetry traces (docs/architecture.md §2.9): the sampling decision per request, span
/// and trace ids, and the hand-off of finished spans to the exporter.
///
/// One per process (built by `SessionManager` from `tracing:`; nil when traces are off, so a
/// request pays one nil check). Thread-safe: the sampler is immutable, ids come from one
/// atomic counter mixed by SplitMix64 (no system call per request), and `TraceExporter.submit`
/// takes a short lock. Invariant: only sampled traces get a span object; an unsampled request
/// allocates nothing and its `traceparent` (if any) passes through untouched.
public final class Tracer: Sendable {
    public let sampler: TraceSampler
    public let exporter: TraceExporter
    private let idCounter: Atomic<UInt64>

    public init(config: TracingConfig, logger: Logger, serviceName: String = "bearerd") throws(ConfigErrors) {
        sampler = TraceSampler(ratio: config.sampleRatio)
        var seed = SystemRandomNumberGenerator()
        idCounter = Atomic(seed.next())
        let headers: [(name: String, value: String)]
        switch config.readHeaders() {
        case .success(let h): headers = h
        case .failure(let e):
            throw ConfigErrors([ConfigError(file: "", line: config.line, key: "tracing.headers_file", message: e.message)])
        }
        var tls: TLSContext?
        if config.endpoint.scheme == "https" {
            do throws(TLSError) {
                tls = try TLSContext.client(caFile: nil, clientCert: nil, clientKey: nil, alpn: ["http/1.1"])
            } catch {
                throw ConfigErrors([ConfigError(file: "", line: config.line, key: "tracing.otlp_endpoint", message: "TLS: \(error)")])
            }
        }
        exporter = TraceExporter(endpoint: config.endpoint, headers: headers, tls: tls, logger: logger, serviceName: serviceName)
    }

    /// A fresh non-zero id.
    @inline(__always)
    public func nextID() -> UInt64 {
        TraceIDMix.mix(idCounter.wrappingAdd(TraceIDMix.increment, ordering: .relaxed).newValue)
    }

    /// The span of one proxied exchange when the trace is sampled, else nil. `headers`: the
    /// client's (its `traceparent` and `tracestate` continue its trace); `now`: monotonic ns.
    public func startExchange(_ headers: HTTPHeaders, now: UInt64) -> ExchangeTrace? {
        var parent: TraceParent?
        if let value = headers["traceparent"] { parent = TraceParent.parse(value[...]) }
        var traceID = parent?.traceID ?? TraceID(high: 0, low: nextID())
        guard sampler.sample(parent: parent, traceID: traceID) else { return nil }
        if parent == nil { traceID.high = nextID() }
        let state = parent == nil ? nil : headers["tracestate"]
        return ExchangeTrace(tracer: self, context: TraceContext(traceID: traceID, spanID: SpanID(nextID()), state: state),
                             parent: parent?.parentID ?? SpanID(0), start: now)
    }

    /// A child span of `parent` for work done elsewhere (a token request), its own id.
    func child(of parent: TraceContext) -> TraceContext {
        TraceContext(traceID: parent.traceID, spanID: SpanID(nextID()), state: parent.state)
    }
}

/// The SERVER span of one sampled proxied exchange (docs/architecture.md §2.9). Owned by its
/// `ProxyExchangeDriver`, touched only on the exchange's loop; `finish` hands a `SpanRecord` to
/// the exporter once (later calls do nothing). Holds no token material: the token's generation
/// only.
public final class ExchangeTrace {
    let tracer: Tracer
    public let context: TraceContext
    let parent: SpanID
    let start: UInt64
    private var events: [TraceEvent] = []
    private var finished = false

    init(tracer: Tracer, context: TraceContext, parent: SpanID, start: UInt64) {
        self.tracer = tracer
        self.context = context
        self.parent = parent
        self.start = start
    }

    /// A replay, a DPoP nonce retry, a wait for the session's token.
    public func event(_ name: String, at time: UInt64 = monotonicNanos(), _ attributes: [TraceAttribute] = []) {
        events.append(TraceEvent(name: name, time: time, attributes: attributes))
    }

    /// A rejected request goes again with a newer token (docs/architecture.md §6).
    public func replayed(rejected: UInt64, with generation: UInt64, refreshed: Bool) {
        event("replay", [TraceAttribute("bearerd.token.generation", rejected), TraceAttribute("bearerd.replay.generation", generation),
                         TraceAttribute("bearerd.replay.provisional", !refreshed)])
    }

    /// The upstream request head with this span as the parent of what the upstream does
    /// (`traceparent` replaced; the caller's `tracestate` travels on with the other fields).
    public func propagated(_ head: HTTPRequestHead) -> HTTPRequestHead {
        var h = head
        h.headers.set("traceparent", context.traceparent)
        return h
    }

    /// Ends the span with what the exchange came to. `status`: the client's status (0: none).
    public func finish(method: String, route: String, session: String?, upstream: String, status: Int, replays: Int,
                       generation: UInt64?, outcome: String?, protocolName: String, end: UInt64) {
        guard !finished else { return }
        finished = true
        var attributes = [
            TraceAttribute("http.request.method", method),
            TraceAttribute("http.route", route),
            TraceAttribute("server.address", upstream),
            TraceAttribute("network.protocol.name", protocolName),
            TraceAttribute("bearerd.replayed", replays > 0),
        ]
        if status > 0 { attributes.append(TraceAttribute("http.response.status_code", status)) }
        if replays > 0 { attributes.append(TraceAttribute("bearerd.replays", replays)) }
        if let session { attributes.append(TraceAttribute("bearerd.session", session)) }
        if let generation { attributes.append(TraceAttribute("bearerd.token.generation", generation)) }
        if let outcome { attributes.append(TraceAttribute("bearerd.outcome", outcome)) }
        let failed = status >= 500 || status == 0
        tracer.exporter.submit(SpanRecord(context: context, parent: parent, name: method + " " + route, kind: .server,
                                          start: start, end: end, attributes: attributes, events: events,
                                          status: failed ? .error(outcome ?? (status == 0 ? "no response" : "status \(status)")) : .unset))
    }
}

/// A session's token-request spans (docs/architecture.md §2.9), on the session queue only.
///
/// Owns the trace context of the first sampled exchange that waited while no fetch was traced
/// (`waiting`), and the span of the fetch in progress (`span`). A fetch started while an
/// exchange waits becomes a CLIENT child span of that exchange's span; exchanges that join a
/// traced fetch are recorded as links. Background refreshes nobody waits for are not traced.
struct SessionTracing {
    var tracer: Tracer?
    private var waiting: TraceContext?
    private var span: (context: TraceContext, parent: SpanID, start: UInt64, attributes: [TraceAttribute], events: [TraceEvent], links: [TraceLink])?

    init(tracer: Tracer?) { self.tracer = tracer }

    /// An exchange with `trace` waits for this session's answer.
    mutating func join(_ trace: TraceContext?) {
        guard let trace, tracer != nil else { return }
        if span != nil {
            span?.links.append(TraceLink(traceID: trace.traceID, spanID: trace.spanID))
        } else if waiting == nil {
            waiting = trace
        }
    }

    /// A fetch starts: traced when an exchange waits for it.
    mutating func begin(grant: String, reason: String, attempt: Int) {
        guard let tracer, let parent = waiting, span == nil else { return }
        waiting = nil
        span = (tracer.child(of: parent), parent.spanID, monotonicNanos(),
                [TraceAttribute("bearerd.grant", grant), TraceAttribute("bearerd.token.reason", reason),
                 TraceAttribute("bearerd.token.attempt", attempt)], [], [])
    }

    /// The token request with this fetch's `traceparent` (the endpoint continues the trace).
    func propagated(_ request: EncodedTokenRequest, url: String) -> EncodedTokenRequest {
        guard let span else { return request }
        return EncodedTokenRequest(body: request.body, headers: request.headers + [("traceparent", span.context.traceparent)])
    }

    mutating func event(_ name: String, _ attributes: [TraceAttribute] = []) {
        span?.events.append(TraceEvent(name: name, time: monotonicNanos(), attributes: attributes))
    }

    /// The fetch ended: its outcome, the server's `error` and status, whether the answer came
    /// from a cache (state file, shared cache) instead of a request.
    mutating func end(_ result: Result<TokenGrant, TokenEndpointFailure>, adopted: Bool, generation: UInt64,
                      at end: UInt64 = monotonicNanos(), url: String) {
        // The waiters of this fetch have their answer: a context left from one that joined an
        // untraced fetch must not become the parent of a later, unrelated one.
        waiting = nil
        guard let tracer, let s = span else { return }
        span = nil
        var attributes = s.attributes
        if !url.isEmpty { attributes.append(TraceAttribute("url.full", url)) }
        attributes.append(TraceAttribute("bearerd.cache_hit", adopted))
        let status: TraceStatus
        switch result {
        case .success:
            attributes.append(TraceAttribute("bearerd.outcome", adopted ? "adopted" : "ok"))
            attributes.append(TraceAttribute("bearerd.token.generation", generation))
            status = .unset
        case .failure(let f):
            attributes.append(TraceAttribute("bearerd.outcome", "failed"))
            attributes.append(TraceAttribute("error.type", f.reason))
            if let e = f.oauthError { attributes.append(TraceAttribute("oauth.error", e)) }
            if let code = f.status { attributes.append(TraceAttribute("http.response.status_code", code)) }
            status = .error(f.oauthError ?? f.reason)
        }
        tracer.exporter.submit(SpanRecord(context: s.context, parent: s.parent, name: "token request", kind: .client,
                                          start: s.start, end: end, attributes: attributes, events: s.events,
                                          links: s.links, status: status))
    }
}
