import Foundation
import Testing
@testable import BearerdTestSupport

/// Traces of on-behalf-of requests (docs/architecture.md §2.9, §6.16): the exchange a caller's
/// request waited for is a CLIENT child span of the request's span, in the client's trace, and
/// the STS receives that child as its `traceparent`; a cached caller's next request has no
/// token span. Against exchange_sts.py and the OTLP receiver (opentelemetry-proto).
@Suite("On behalf of callers: traces", .serialized)
struct OnBehalfOfTracingTests {
    @Test func aCallersExchangeIsAChildSpanOfItsRequest() throws {
        let peers = try OnBehalfOfTests.Peers()
        defer { peers.stop() }
        let receiver = try TracingTests.receiver()
        defer { receiver.stop() }
        let port = try RunningBearerd.freePort()
        let bearerd = try RunningBearerd(config: """
            listen: 127.0.0.1:\(port)
            sessions:
            \(OnBehalfOfTests.exchangeSession(peers))
            routes:
            \(OnBehalfOfTests.apiRoute(peers))
            tracing: { otlp_endpoint: "http://127.0.0.1:\(receiver.port)", sample_ratio: 0.0 }
            """, dir: try RunningBearerd.tempDir("obo-trace"))
        defer { _ = bearerd.stop() }
        let deadline = Date().addingTimeInterval(10)
        while (try? TestClient.get(port: port, path: "/warm")) == nil {
            guard bearerd.process.isRunning, Date() < deadline else { throw OnBehalfOfTests.Failure(description: "bearerd did not serve: \(bearerd.logs)") }
            Thread.sleep(forTimeInterval: 0.05)
        }
        let token = try peers.mint("tess")
        // sample_ratio 0: only the client's sampled traceparent makes these two requests traced.
        let trace = TracingTests.clientTrace, parent = TracingTests.clientSpan
        for _ in 0..<2 {
            let r = try TestClient.get(port: port, path: "/api/t", headers: [("Authorization", "Bearer \(token)"),
                                                                             ("traceparent", "00-\(trace)-\(parent)-01")])
            #expect(r.status == 200, "\(r.status) \(r.bodyText)")
        }
        let spans = try #require(try TracingTests.eventually(10) { () -> [[String: Any]]? in
            let all = try TracingTests.getJSON(port: receiver.port, "/spans")
            return all.filter({ $0["kind"] as? Int == 2 }).count >= 2 ? all : nil
        }, "no spans arrived")
        let servers = spans.filter { $0["kind"] as? Int == 2 }
        let exchanges = spans.filter { $0["name"] as? String == "token exchange for a caller" }
        #expect(servers.count == 2 && servers.allSatisfy { $0["trace_id"] as? String == trace && $0["parent_span_id"] as? String == parent })
        // One exchange for the two requests (the second was a cache hit), a child of the first.
        try #require(exchanges.count == 1, "\(spans)")
        let child = exchanges[0]
        #expect(child["kind"] as? Int == 3)
        #expect(child["trace_id"] as? String == trace)
        let childParent = try #require(child["parent_span_id"] as? String)
        #expect(servers.contains { $0["span_id"] as? String == childParent })
        let attributes = child["attributes"] as? [String: Any] ?? [:]
        #expect(attributes["bearerd.grant"] as? String == "token_exchange" && attributes["bearerd.outcome"] as? String == "ok")
        // No token material in any span.
        let text = String(decoding: try JSONSerialization.data(withJSONObject: spans), as: UTF8.self)
        #expect(!text.contains(OnBehalfOfTests.signature(token)))
        // The STS continued the trace from the child span.
        let log = try peers.stsStats().log
        #expect(log.count == 1 && log[0]["traceparent"] as? String == "00-\(trace)-\(child["span_id"] as? String ?? "?")-01", "\(log)")
    }
}
