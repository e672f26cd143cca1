import BearerdOAuth
import Logging
import Testing
@testable import BearerdConfig
@testable import BearerdProxyCore
@testable import BearerdSessions

/// A session's token-request spans (docs/architecture.md §2.9): which fetch becomes a child of
/// which waiting exchange.
struct SessionTracingTests {
    static func tracer() throws -> Tracer {
        try Tracer(config: TracingConfig(endpoint: EndpointURL(scheme: "http", host: "127.0.0.1", port: 9, path: "/v1/traces")),
                   logger: Logger(label: "test"))
    }

    static let request = EncodedTokenRequest(body: [], headers: [("Content-Type", "application/x-www-form-urlencoded")])
    static let ok: Result<TokenGrant, TokenEndpointFailure> = .success(TokenGrant(accessToken: OAuthSecret("t"), lifetime: .seconds(60)))

    @Test func aFetchStartedForAWaitingExchangeIsItsChild() throws {
        let tracer = try Self.tracer()
        var t = SessionTracing(tracer: tracer)
        let exchange = TraceContext(traceID: TraceID(high: 1, low: 2), spanID: SpanID(3))
        t.join(exchange)
        t.begin(grant: "client_credentials", reason: "initial", attempt: 1)
        let sent = t.propagated(Self.request, url: "")
        let field = try #require(sent.headers.last { $0.name == "traceparent" })
        let parent = try #require(TraceParent.parse(field.value[...]))
        #expect(parent.traceID == exchange.traceID)
        #expect(parent.parentID != exchange.spanID)
        // A second exchange joining the traced fetch becomes a link, not a second parent.
        t.join(TraceContext(traceID: TraceID(high: 7, low: 8), spanID: SpanID(9)))
        t.end(Self.ok, adopted: false, generation: 1, url: "")
        #expect(tracer.exporter.counters.queued == 1)
    }

    /// An exchange that joined a fetch nobody traced (a background refresh in flight) got its
    /// answer from that fetch: a later fetch nobody waits for must not become its child.
    @Test func aContextLeftFromAnUntracedFetchIsForgotten() throws {
        let tracer = try Self.tracer()
        var t = SessionTracing(tracer: tracer)
        t.begin(grant: "client_credentials", reason: "refresh", attempt: 1)  // nobody waits: untraced
        t.join(TraceContext(traceID: TraceID(high: 1, low: 2), spanID: SpanID(3)))  // joins it
        t.end(Self.ok, adopted: false, generation: 1, url: "")
        t.begin(grant: "client_credentials", reason: "refresh", attempt: 1)  // an hour later
        #expect(!t.propagated(Self.request, url: "").headers.contains { $0.name == "traceparent" })
        t.end(Self.ok, adopted: false, generation: 2, url: "")
        #expect(tracer.exporter.counters.queued == 0)
    }
}
