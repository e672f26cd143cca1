import Foundation
import Testing
import BearerdConfig
import BearerdProxyCore
import BearerdTestSupport

/// docs/architecture.md §2.9, end to end: the spans bearerd exports, decoded by the reference
/// OTLP decoder (opentelemetry-proto from PyPI, Tests/Fixtures/otlp_receiver.py), the
/// `traceparent` the upstream and the token endpoint receive, and a dead collector.
@Suite("OpenTelemetry traces", .serialized)
struct TracingTests {
    static let clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
    static let clientSpan = "00f067aa0ba902b7"

    static func receiver() throws -> PythonFixture {
        try Prerequisite.require(PythonFixture.unavailable(modules: ["opentelemetry.proto"]) == nil,
                                 "opentelemetry-proto in the tests' venv (Tests/Fixtures/requirements.txt)")
        return try PythonFixture(script: "otlp_receiver.py", arguments: [], readyTimeout: 30)
    }

    static func getJSON(port: UInt16, _ path: String) throws -> [[String: Any]] {
        let r = try TestClient.get(port: port, path: path)
        return try #require(try JSONSerialization.jsonObject(with: Data(r.body)) as? [[String: Any]])
    }

    /// Polls `body` until it returns non-nil (at most `seconds`).
    static func eventually<T>(_ seconds: Double = 10, _ body: () throws -> T?) throws -> T? {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if let v = try body() { return v }
            Thread.sleep(forTimeInterval: 0.05)
        }
        return try body()
    }

    static func bearer(_ r: TestOrigin.Request) -> String? {
        r.head.headers["Authorization"].map { String($0.dropFirst("Bearer ".count)) }
    }

    /// A request the upstream rejects once (401 for the first token), replayed with a token from
    /// a forced refresh: one SERVER span continuing the client's trace, with the replay as an
    /// event, and a CLIENT child span for the token request it waited for; the upstream gets
    /// `traceparent` with the client's trace id and bearerd's span as parent, both times, and the
    /// token endpoint gets the child span as parent. The headers_file's field reaches the collector.
    @Test func aReplayedRequestMakesOneSpanTreeInTheClientsTrace() throws {
        let collector = try Self.receiver()
        defer { collector.stop() }
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        // The first attempt of /traced is rejected as a dead token; every other request passes.
        let attempts = TraceTestCounter()
        let origin = try TestOrigin { r in
            if r.head.target == "/traced", attempts.next() == 1 {
                return .response(status: 401, headers: [("WWW-Authenticate", "Bearer error=\"invalid_token\"")], body: Array("no".utf8))
            }
            return .response(status: 200, headers: [], body: Array("ok".utf8))
        }
        defer { origin.stop() }
        let dir = NSTemporaryDirectory() + "bearerd-otlp-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try "Authorization: Api-Key collector-secret\n".write(toFile: dir + "/otlp-headers", atomically: true, encoding: .utf8)
        // sample_ratio 0: only the client's sampled trace is recorded.
        let tracing = TracingConfig(endpoint: EndpointURL(scheme: "http", host: "127.0.0.1", port: collector.port, path: "/v1/traces"),
                                    sampleRatio: 0, headersFile: dir + "/otlp-headers")
        let proxy = try TestProxy(routes: [withSession(route(origin: origin.port))], sessions: [scriptedSession(tokens)], admin: true, tracing: tracing)
        defer { proxy.stop() }

        // The session's first token (fetched at start, nobody waiting: not traced), then a request
        // outside any sampled trace (ratio 0): neither is exported.
        try #require(try Self.eventually { tokens.issued.isEmpty ? nil : true } == true, "no first token")
        #expect(try TestClient.get(port: proxy.port, path: "/untraced").status == 200)

        let traceparent = "00-\(Self.clientTrace)-\(Self.clientSpan)-01"
        let r = try TestClient.get(port: proxy.port, path: "/traced", headers: [("traceparent", traceparent), ("tracestate", "vendor=abc")])
        #expect(r.status == 200, "\(r.status) \(r.bodyText)")
        #expect(tokens.issued.count == 2, "the replay carried a token from a forced refresh")

        let spans = try #require(try Self.eventually { () -> [[String: Any]]? in
            let s = try Self.getJSON(port: collector.port, "/spans")
            return s.count >= 2 ? s : nil
        }, "no spans exported: \(collector.log)")
        Thread.sleep(forTimeInterval: 1.2)  // a later batch would bring spans that should not exist
        let all = try Self.getJSON(port: collector.port, "/spans")
        #expect(all.count == 2, "exactly the exchange and its token request: \(all)")
        #expect(all.allSatisfy { $0["trace_id"] as? String == Self.clientTrace }, "\(all)")

        let server = try #require(spans.first { $0["kind"] as? Int == 2 }, "\(spans)")
        let serverID = try #require(server["span_id"] as? String)
        #expect(server["parent_span_id"] as? String == Self.clientSpan)
        #expect(server["trace_state"] as? String == "vendor=abc")
        #expect(server["name"] as? String == "GET /")
        let attributes = try #require(server["attributes"] as? [String: Any])
        #expect(attributes["http.route"] as? String == "/")
        #expect(attributes["bearerd.session"] as? String == "s")
        #expect(attributes["server.address"] as? String == "127.0.0.1:\(origin.port)")
        #expect(attributes["http.response.status_code"] as? Int == 200)
        #expect(attributes["bearerd.replayed"] as? Bool == true)
        #expect(attributes["bearerd.token.generation"] as? Int == 2)
        let events = try #require(server["events"] as? [[String: Any]])
        #expect(events.map { $0["name"] as? String } == ["replay"])
        let replay = try #require(events.first?["attributes"] as? [String: Any])
        #expect(replay["bearerd.token.generation"] as? Int == 1)
        #expect(replay["bearerd.replay.generation"] as? Int == 2)
        // No token material anywhere in the span.
        let text = String(decoding: try JSONSerialization.data(withJSONObject: all), as: UTF8.self)
        for t in tokens.issued { #expect(!text.contains(t), "token \(t) in a span") }

        let token = try #require(spans.first { $0["kind"] as? Int == 3 }, "\(spans)")
        let tokenID = try #require(token["span_id"] as? String)
        #expect(token["parent_span_id"] as? String == serverID)
        #expect(token["name"] as? String == "token request")
        let tokenAttributes = try #require(token["attributes"] as? [String: Any])
        #expect(tokenAttributes["bearerd.grant"] as? String == "client_credentials")
        #expect(tokenAttributes["bearerd.token.reason"] as? String == "rejected")
        #expect(tokenAttributes["bearerd.outcome"] as? String == "ok")
        #expect(tokenAttributes["bearerd.cache_hit"] as? Bool == false)
        #expect(tokenAttributes["bearerd.token.generation"] as? Int == 2)
        let (start, end) = (try #require(server["start"] as? Int), try #require(server["end"] as? Int))
        let (tStart, tEnd) = (try #require(token["start"] as? Int), try #require(token["end"] as? Int))
        #expect(start <= tStart && tEnd <= end, "the token request lies inside the exchange")
        // Wall-clock times (within a minute of now).
        #expect(abs(Double(start) / 1e9 - Date().timeIntervalSince1970) < 60)

        // The upstream got bearerd's span as parent, on both attempts; the token endpoint the child.
        let traced = origin.requests.filter { $0.head.target == "/traced" }
        #expect(traced.count == 2)
        for t in traced {
            #expect(t.head.headers["traceparent"] == "00-\(Self.clientTrace)-\(serverID)-01")
            #expect(t.head.headers["tracestate"] == "vendor=abc")
        }
        #expect(origin.requests.first { $0.head.target == "/untraced" }?.head.headers["traceparent"] == nil)
        #expect(tokens.calls.map(\.traceparent) == [nil, "00-\(Self.clientTrace)-\(tokenID)-01"])

        let exports = try Self.getJSON(port: collector.port, "/requests")
        #expect(exports.allSatisfy { $0["authorization"] as? String == "Api-Key collector-secret" }, "\(exports)")
        #expect(!proxy.logs.text.contains("collector-secret"))
        let adminPort = try #require(proxy.server.adminAddress).port
        let metrics = try TestClient.get(port: adminPort, path: "/metrics").bodyText
        #expect(metrics.contains("bearerd_trace_spans_exported_total 2"), "\(metrics)")
    }

    /// The forced refresh of a replay refused by the token endpoint: the client gets bearerd's
    /// 503, the exchange's span is an error, and its token-request child carries the server's
    /// `error` and status (never the secret it sent).
    @Test func aRefusedTokenRequestCarriesTheServersError() throws {
        let collector = try Self.receiver()
        defer { collector.stop() }
        let tokens = try ScriptedTokenEndpoint { call in
            call.index == 0 ? .token(lifetime: 3600) : .json(status: 400, body: #"{"error":"invalid_client","error_description":"client disabled"}"#)
        }
        defer { tokens.stop() }
        let origin = try TestOrigin { r in
            r.head.target == "/traced"
                ? .response(status: 401, headers: [("WWW-Authenticate", "Bearer error=\"invalid_token\"")], body: Array("no".utf8))
                : .response(status: 200, headers: [], body: Array("ok".utf8))
        }
        defer { origin.stop() }
        let tracing = TracingConfig(endpoint: EndpointURL(scheme: "http", host: "127.0.0.1", port: collector.port, path: "/v1/traces"), sampleRatio: 0)
        let proxy = try TestProxy(routes: [withSession(route(origin: origin.port))], sessions: [scriptedSession(tokens)], tracing: tracing)
        defer { proxy.stop() }
        try #require(try Self.eventually { tokens.issued.isEmpty ? nil : true } == true, "no first token")

        let r = try TestClient.get(port: proxy.port, path: "/traced", headers: [("traceparent", "00-\(Self.clientTrace)-\(Self.clientSpan)-01")])
        #expect(r.status == 503, "\(r.status) \(r.bodyText)")
        let spans = try #require(try Self.eventually { () -> [[String: Any]]? in
            let s = try Self.getJSON(port: collector.port, "/spans")
            return s.count >= 2 ? s : nil
        }, "no spans exported: \(collector.log)")
        let server = try #require(spans.first { $0["kind"] as? Int == 2 }, "\(spans)")
        #expect((server["attributes"] as? [String: Any])?["http.response.status_code"] as? Int == 503)
        #expect((server["status"] as? [String: Any])?["code"] as? Int == 2)
        let token = try #require(spans.first { $0["kind"] as? Int == 3 }, "\(spans)")
        #expect(token["parent_span_id"] as? String == server["span_id"] as? String)
        let a = try #require(token["attributes"] as? [String: Any])
        #expect(a["bearerd.outcome"] as? String == "failed")
        #expect(a["oauth.error"] as? String == "invalid_client")
        #expect(a["http.response.status_code"] as? Int == 400)
        #expect(a["bearerd.token.reason"] as? String == "rejected")
        #expect((token["status"] as? [String: Any])?["code"] as? Int == 2)
        #expect((token["status"] as? [String: Any])?["message"] as? String == "invalid_client")
        // The token request that failed carried the child span as its parent.
        #expect(tokens.calls.last?.traceparent == "00-\(Self.clientTrace)-\(token["span_id"] as? String ?? "")-01")
    }

    /// DPoP (RFC 9449 §9): the origin's nonce demand and the resend with a fresh proof are one
    /// exchange, whose span records the retry as an event (the real binary, the real DPoP
    /// origin and authorization server of DPoPTests).
    @Test func aDPoPNonceRetryIsAnEventOfTheExchange() throws {
        try Prerequisite.require(AuthServerFixture.isAvailable, AuthServerFixture.unavailableReason ?? "the OAuth fixture")
        let collector = try Self.receiver()
        defer { collector.stop() }
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        #expect(try auth.request("POST", "/_test/dpop?enable=1&nonce=1").status == 200)
        let origin = try PythonFixture(script: "dpop_origin.py", arguments: ["--port", "0"])
        defer { origin.stop() }
        let dir = try RunningBearerd.tempDir("dpop-trace")
        let port = try RunningBearerd.freePort()
        let cfg = DPoPEndToEndTests.config(port: port, auth: auth, origin: origin.port, stateDir: dir + "/state")
            + "\ntracing: { otlp_endpoint: \"http://127.0.0.1:\(collector.port)/v1/traces\", sample_ratio: 0 }\n"
        let b = try RunningBearerd(config: cfg, dir: dir)
        defer { _ = b.stop() }
        let first = try #require(b.waitServing(port: port, path: "/warm"))
        #expect(first.status == 200, "\(first.bodyText) \(b.logs)")
        // A new nonce at the origin: the next request is refused once with it, then sent again.
        _ = try DPoPEndToEndTests.raw(origin.port, "POST /_test/rotate-nonce HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", method: "POST")
        let r = try TestClient.get(port: port, path: "/traced", headers: [("traceparent", "00-\(Self.clientTrace)-\(Self.clientSpan)-01")])
        #expect(r.status == 200, "\(r.bodyText)")
        let spans = try #require(try Self.eventually { () -> [[String: Any]]? in
            let s = try Self.getJSON(port: collector.port, "/spans")
            return s.isEmpty ? nil : s
        }, "no spans exported: \(collector.log) \(b.logs)")
        #expect(spans.count == 1, "only the traced exchange (the token was not waited for): \(spans)")
        let server = try #require(spans.first)
        #expect(server["trace_id"] as? String == Self.clientTrace)
        let events = (server["events"] as? [[String: Any]] ?? []).compactMap { $0["name"] as? String }
        #expect(events == ["dpop.nonce_retry"], "\(server)")
        #expect((server["attributes"] as? [String: Any])?["http.response.status_code"] as? Int == 200)
    }

    /// A collector that is not there: every request is answered as without tracing (upstream
    /// reached, traceparent sent), and the spans that could not be delivered are counted as dropped.
    @Test func aDeadCollectorChangesNothingForTraffic() throws {
        let origin = try TestOrigin { _ in .response(status: 200, headers: [], body: Array("ok".utf8)) }
        defer { origin.stop() }
        // A port nothing listens on: bound, then closed.
        let dead = NginxOrigin.freePort()
        let tracing = TracingConfig(endpoint: EndpointURL(scheme: "http", host: "127.0.0.1", port: dead, path: "/v1/traces"), sampleRatio: 1)
        let proxy = try TestProxy(routes: [route(origin: origin.port)], admin: true, tracing: tracing)
        defer { proxy.stop() }
        let started = Date()
        for i in 0..<20 {
            let r = try TestClient.get(port: proxy.port, path: "/r\(i)")
            #expect(r.status == 200)
        }
        #expect(Date().timeIntervalSince(started) < 5)
        #expect(origin.requests.count == 20)
        #expect(origin.requests.allSatisfy { TraceParent.parse(($0.head.headers["traceparent"] ?? "")[...])?.sampled == true })
        let adminPort = try #require(proxy.server.adminAddress).port
        let dropped = try Self.eventually(15) { () -> String? in
            let m = try TestClient.get(port: adminPort, path: "/metrics").bodyText
            return m.contains("bearerd_trace_spans_dropped_total{reason=\"export_failed\"} 20") ? m : nil
        }
        #expect(dropped != nil, "the 20 spans were not counted as dropped")
        if let dropped {
            #expect(dropped.contains("bearerd_trace_spans_exported_total 0"))
            #expect(dropped.contains("bearerd_trace_export_retries_total 2"))
        }
        // Traffic after the failures is served as before.
        #expect(try TestClient.get(port: proxy.port, path: "/after").status == 200)
        #expect(proxy.logs.text.contains("trace export failed; spans dropped"))
    }

    /// bearerd's encoder against the reference decoder, for every field it writes (links, bool
    /// and int attributes, error status included, which the proxy tests above may not reach).
    @Test func theReferenceDecoderReadsEveryFieldBearerdWrites() throws {
        try Prerequisite.require(PythonFixture.unavailable(modules: ["opentelemetry.proto"]) == nil,
                                 "opentelemetry-proto in the tests' venv (Tests/Fixtures/requirements.txt)")
        let ctx = TraceContext(traceID: TraceID(high: 0x0102_0304_0506_0708, low: 0x090a_0b0c_0d0e_0f10), spanID: SpanID(0xAA), state: "k=v")
        let span = SpanRecord(context: ctx, parent: SpanID(0xBB), name: "token request", kind: .client, start: 10, end: 20,
                              attributes: [TraceAttribute("s", "é"), TraceAttribute("i", -5), TraceAttribute("b", false), TraceAttribute("big", UInt64.max)],
                              events: [TraceEvent(name: "dpop.nonce_retry", time: 15, attributes: [TraceAttribute("n", 1)])],
                              links: [TraceLink(traceID: TraceID(high: 1, low: 2), spanID: SpanID(3))],
                              status: .error("invalid_client"))
        let root = SpanRecord(context: TraceContext(traceID: ctx.traceID, spanID: SpanID(0xBB)), parent: SpanID(0), name: "GET /", kind: .server,
                              start: 5, end: 30)
        let bytes = OTLPEncoding.exportRequest([span, root], resource: [TraceAttribute("service.name", "bearerd")], scopeName: "bearerd",
                                               scopeVersion: "9.9", wallOffset: 1_000)
        let file = NSTemporaryDirectory() + "bearerd-otlp-\(UUID().uuidString.prefix(8)).bin"
        try Data(bytes).write(to: URL(fileURLWithPath: file))
        defer { try? FileManager.default.removeItem(atPath: file) }
        let out = try PythonFixture.runClient(script: "otlp_receiver.py", arguments: ["--decode", file])
        let decoded = try #require(try JSONSerialization.jsonObject(with: Data(out.utf8)) as? [[String: Any]], "\(out)")
        #expect(decoded.count == 2)
        let s = try #require(decoded.first)
        #expect(s["trace_id"] as? String == "0102030405060708090a0b0c0d0e0f10")
        #expect(s["span_id"] as? String == "00000000000000aa")
        #expect(s["parent_span_id"] as? String == "00000000000000bb")
        #expect(s["trace_state"] as? String == "k=v")
        #expect(s["kind"] as? Int == 3)
        #expect(s["start"] as? Int == 1_010)
        #expect(s["end"] as? Int == 1_020)
        #expect(s["flags"] as? Int == 1)
        let a = try #require(s["attributes"] as? [String: Any])
        #expect(a["s"] as? String == "é")
        #expect(a["i"] as? Int == -5)
        #expect(a["b"] as? Bool == false)
        #expect(a["big"] as? Int == Int.max)  // clamped to int64
        let e = try #require((s["events"] as? [[String: Any]])?.first)
        #expect(e["name"] as? String == "dpop.nonce_retry")
        #expect(e["time"] as? Int == 1_015)
        #expect((e["attributes"] as? [String: Any])?["n"] as? Int == 1)
        let l = try #require((s["links"] as? [[String: Any]])?.first)
        #expect(l["trace_id"] as? String == "00000000000000010000000000000002")
        #expect(l["span_id"] as? String == "0000000000000003")
        #expect((s["status"] as? [String: Any])?["code"] as? Int == 2)
        #expect((s["status"] as? [String: Any])?["message"] as? String == "invalid_client")
        #expect((s["resource"] as? [String: Any])?["service.name"] as? String == "bearerd")
        #expect((s["scope"] as? [String: Any])?["version"] as? String == "9.9")
        let r = try #require(decoded.last)
        #expect(r["parent_span_id"] as? String == "")
        #expect((r["status"] as? [String: Any])?["code"] as? Int == 0)
    }
}

/// A thread-safe counter for origin handlers.
final class TraceTestCounter: @unchecked Sendable {  // @unchecked: `n` guarded by `lock`
    private let lock = NSLock()
    private var n = 0
    func next() -> Int { lock.withLock { n += 1; return n } }
}
