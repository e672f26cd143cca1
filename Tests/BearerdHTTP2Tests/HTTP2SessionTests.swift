import Testing
import BearerdHTTP
@testable import BearerdHTTP2

/// A client and a server engine wired back to back in memory (like the TLS engine tests): `pump`
/// moves bytes both ways until neither has anything to send, collecting each side's events.
final class Pair {
    let client: HTTP2Session
    let server: HTTP2Session
    var clientEvents: [HTTP2Event] = []
    var serverEvents: [HTTP2Event] = []
    /// Bytes each side sent, for inspection.
    var clientWire: [UInt8] = []

    init(client: HTTP2Settings = HTTP2Settings(), server: HTTP2Settings = HTTP2Settings()) throws {
        self.client = try HTTP2Session(role: .client, settings: client)
        self.server = try HTTP2Session(role: .server, settings: server)
        try pump()
    }

    func pump() throws {
        for _ in 0..<10_000 {
            var a: [UInt8] = []
            try client.produce(into: &a)
            clientWire += a
            if !a.isEmpty { try server.receive(a) }
            serverEvents += server.takeEvents()
            var b: [UInt8] = []
            try server.produce(into: &b)
            if !b.isEmpty { try client.receive(b) }
            clientEvents += client.takeEvents()
            if a.isEmpty && b.isEmpty { return }
        }
        Issue.record("pump did not settle")
    }

    func body(_ events: [HTTP2Event], stream: Int32) -> [UInt8] {
        var out: [UInt8] = []
        for case .data(let s, let bytes, _) in events where s == stream { out += bytes }
        return out
    }

    func ended(_ events: [HTTP2Event], stream: Int32) -> Bool {
        events.contains { e in
            if case .data(stream, _, true) = e { return true }
            if case .headers(stream, _, _, true) = e { return true }
            return false
        }
    }

    func consumeAll(_ side: HTTP2Session, _ events: [HTTP2Event]) {
        for case .data(let s, let bytes, _) in events { side.consumed(stream: s, count: bytes.count) }
    }
}

func f(_ pairs: [(String, String)]) -> [HTTPField] { pairs.map { HTTPField(name: $0.0, value: $0.1) } }

let getRequest = f([(":method", "GET"), (":scheme", "http"), (":authority", "api.example"), (":path", "/v1/x"), ("authorization", "Bearer secret-token")])

@Suite("HTTP2Session: two engines in memory")
struct HTTP2SessionTests {
    /// A long-lived connection keeps nothing of its finished streams: neither nghttp2 (which
    /// kept every closed client stream for the priority tree, ~300 bytes a request, until the
    /// connection closed) nor the session's own tables.
    @Test func finishedStreamsLeaveNoStateBehind() throws {
        let p = try Pair()
        var ids: [Int32] = []
        for i in 0..<300 {
            let id = try p.client.submitRequest(getRequest, endStream: true)
            ids.append(id)
            try p.pump()
            try p.server.submitResponse(stream: id, f([(":status", "200")]), endStream: false)
            Array("answer \(i)".utf8).withUnsafeBytes { p.server.sendData(stream: id, $0) }
            p.server.endStream(stream: id, trailers: nil)
            try p.pump()
            p.consumeAll(p.client, p.clientEvents)
            p.clientEvents.removeAll()
            #expect(p.serverEvents.contains { if case .streamClosed(id, 0) = $0 { return true }; return false })
            p.serverEvents.removeAll()
        }
        let server = p.server.retainedState
        let client = p.client.retainedState
        for id in ids {
            #expect(!server.nghttp2Knows(id), "the server session still holds stream \(id)")
            #expect(!client.nghttp2Knows(id), "the client session still holds stream \(id)")
        }
        #expect(server.swiftEntries == 0)
        #expect(client.swiftEntries == 0)
    }

    @Test func requestAndResponseRoundTrip() throws {
        let p = try Pair()
        let id = try p.client.submitRequest(getRequest, endStream: true)
        try p.pump()
        guard case .headers(id, let fields, .request, true)? = p.serverEvents.first(where: { if case .headers = $0 { return true }; return false }) else {
            Issue.record("no request: \(p.serverEvents)")
            return
        }
        #expect(fields == getRequest)
        try p.server.submitResponse(stream: id, f([(":status", "200"), ("content-type", "text/plain")]), endStream: false)
        "hello".utf8.withContiguousStorageIfAvailable { p.server.sendData(stream: id, UnsafeRawBufferPointer($0)) }
        p.server.endStream(stream: id, trailers: nil)
        try p.pump()
        #expect(p.clientEvents.contains(.headers(stream: id, fields: f([(":status", "200"), ("content-type", "text/plain")]), kind: .response, endStream: false)))
        #expect(p.body(p.clientEvents, stream: id) == Array("hello".utf8))
        #expect(p.ended(p.clientEvents, stream: id))
        #expect(p.clientEvents.contains(.streamClosed(stream: id, errorCode: 0)))
        #expect(p.client.openStreamCount == 0)
    }

    /// Body bytes and ends land on their own streams however the calls for several streams
    /// interleave (the session remembers the last stream's outbound entry): runs of one stream,
    /// alternation, a reset in between, a stream ended before another gets data.
    @Test func interleavedStreamsKeepTheirOwnBodies() throws {
        let p = try Pair()
        var ids: [Int32] = []
        for _ in 0..<6 { ids.append(try p.client.submitRequest(getRequest, endStream: true)) }
        try p.pump()
        for id in ids { try p.server.submitResponse(stream: id, f([(":status", "200")]), endStream: false) }
        var expected: [Int32: [UInt8]] = [:]
        func send(_ id: Int32, _ text: String) {
            Array(text.utf8).withUnsafeBytes { p.server.sendData(stream: id, $0) }
            expected[id, default: []] += Array(text.utf8)
        }
        // A run on one stream, then alternation, with a flush in the middle.
        send(ids[0], "a0"); send(ids[0], "a1"); send(ids[1], "b0"); send(ids[0], "a2"); send(ids[2], "c0")
        try p.pump()
        send(ids[1], "b1"); send(ids[3], "d0"); send(ids[1], "b2")
        // Stream 4 is reset right after its own data (the remembered stream); later data is dropped.
        Array("e0".utf8).withUnsafeBytes { p.server.sendData(stream: ids[4], $0) }
        p.server.resetStream(ids[4], error: .cancel)
        Array("late".utf8).withUnsafeBytes { p.server.sendData(stream: ids[4], $0) }
        #expect(p.server.outboundBuffered(stream: ids[4]) == 0)
        p.server.endStream(stream: ids[0], trailers: nil)
        send(ids[5], "f0")
        p.server.endStream(stream: ids[1], trailers: nil)
        // Data after an end is dropped, and the ended stream's entry goes once read.
        Array("after".utf8).withUnsafeBytes { p.server.sendData(stream: ids[0], $0) }
        for id in [ids[2], ids[3], ids[5]] { p.server.endStream(stream: id, trailers: nil) }
        try p.pump()
        for (i, id) in ids.enumerated() where i != 4 {
            #expect(p.body(p.clientEvents, stream: id) == expected[id, default: []], "stream \(id)")
            #expect(p.ended(p.clientEvents, stream: id), "stream \(id)")
            #expect(p.server.outboundBuffered(stream: id) == 0)
        }
        #expect(!String(decoding: p.body(p.clientEvents, stream: ids[4]), as: UTF8.self).contains("late"))
    }

    /// Authorization goes out never-indexed: the second request's header block carries the
    /// literal again instead of a dynamic-table index (RFC 7541 §6.2.3).
    @Test func authorizationIsNeverIndexed() throws {
        func secondBlockSize(_ request: [HTTPField]) throws -> Int {
            let p = try Pair()
            _ = try p.client.submitRequest(request, endStream: true)
            try p.pump()
            p.clientWire.removeAll()
            _ = try p.client.submitRequest(request, endStream: true)
            try p.pump()
            return p.clientWire.count
        }
        let with = try secondBlockSize(getRequest)
        let without = try secondBlockSize(Array(getRequest.dropLast()))
        // Indexed, the field would cost one byte the second time; never-indexed, its literal again.
        #expect(with - without >= 12)
    }

    @Test func largeBodiesBothWaysWithManualFlowControl() throws {
        var small = HTTP2Settings()
        small.initialWindowSize = 65_535
        small.connectionWindowSize = 65_535
        let p = try Pair(client: small, server: small)
        var post = getRequest
        post[0] = HTTPField(name: ":method", value: "POST")
        let id = try p.client.submitRequest(post, endStream: false)
        let payload = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        payload.withUnsafeBytes { p.client.sendData(stream: id, $0) }
        p.client.endStream(stream: id, trailers: nil)
        try p.pump()
        // Without `consumed` the sender stalls at the window.
        let first = p.body(p.serverEvents, stream: id).count
        #expect(first <= 65_535)
        #expect(first > 0)
        #expect(p.client.outboundBuffered(stream: id) > 0)
        var received = p.body(p.serverEvents, stream: id)
        var rounds = 0
        while !p.ended(p.serverEvents, stream: id) && rounds < 1000 {
            let events = p.serverEvents
            p.serverEvents.removeAll()
            p.consumeAll(p.server, events)
            try p.pump()
            received += p.body(p.serverEvents, stream: id)
            rounds += 1
        }
        #expect(received == payload)
        // And back.
        try p.server.submitResponse(stream: id, f([(":status", "200")]), endStream: false)
        payload.withUnsafeBytes { p.server.sendData(stream: id, $0) }
        p.server.endStream(stream: id, trailers: nil)
        var back: [UInt8] = []
        rounds = 0
        repeat {
            try p.pump()
            let events = p.clientEvents
            p.clientEvents.removeAll()
            back += p.body(events, stream: id)
            p.consumeAll(p.client, events)
            if p.ended(events, stream: id) { break }
            rounds += 1
        } while rounds < 1000
        #expect(back == payload)
    }

    @Test func streamWritableAfterDrainingBelowLowWater() throws {
        let p = try Pair()
        var post = getRequest
        post[0] = HTTPField(name: ":method", value: "POST")
        let id = try p.client.submitRequest(post, endStream: false)
        let chunk = [UInt8](repeating: 1, count: HTTP2Session.highWater)
        chunk.withUnsafeBytes { p.client.sendData(stream: id, $0) }
        #expect(p.client.outboundBuffered(stream: id) == HTTP2Session.highWater)
        try p.pump()
        p.consumeAll(p.server, p.serverEvents)
        try p.pump()
        #expect(p.clientEvents.contains(.streamWritable(stream: id)))
    }

    /// gRPC's shapes: HEADERS, DATA, trailers with grpc-status; and trailers-only.
    @Test func trailersBothShapes() throws {
        let p = try Pair()
        var post = getRequest
        post[0] = HTTPField(name: ":method", value: "POST")
        post.append(HTTPField(name: "content-type", value: "application/grpc"))
        post.append(HTTPField(name: "te", value: "trailers"))
        let id = try p.client.submitRequest(post, endStream: false)
        ([0, 0, 0, 0, 1, 42] as [UInt8]).withUnsafeBytes { p.client.sendData(stream: id, $0) }
        p.client.endStream(stream: id, trailers: f([("x-client-trailer", "1")]))
        try p.pump()
        #expect(p.serverEvents.contains(.headers(stream: id, fields: f([("x-client-trailer", "1")]), kind: .trailers, endStream: true)))
        try p.server.submitResponse(stream: id, f([(":status", "200"), ("content-type", "application/grpc")]), endStream: false)
        ([0, 0, 0, 0, 1, 43] as [UInt8]).withUnsafeBytes { p.server.sendData(stream: id, $0) }
        p.server.endStream(stream: id, trailers: f([("grpc-status", "0"), ("grpc-message", "")]))
        try p.pump()
        #expect(p.body(p.clientEvents, stream: id) == [0, 0, 0, 0, 1, 43])
        #expect(p.clientEvents.contains(.headers(stream: id, fields: f([("grpc-status", "0"), ("grpc-message", "")]), kind: .trailers, endStream: true)))

        let second = try p.client.submitRequest(post, endStream: true)
        try p.pump()
        let only = f([(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "16"), ("grpc-message", "token rejected")])
        try p.server.submitResponse(stream: second, only, endStream: true)
        try p.pump()
        #expect(p.clientEvents.contains(.headers(stream: second, fields: only, kind: .response, endStream: true)))
    }

    @Test func informationalThenFinal() throws {
        let p = try Pair()
        let id = try p.client.submitRequest(getRequest, endStream: true)
        try p.pump()
        try p.server.submitResponse(stream: id, f([(":status", "103"), ("link", "</a.css>; rel=preload")]), endStream: false)
        try p.server.submitResponse(stream: id, f([(":status", "204")]), endStream: true)
        try p.pump()
        #expect(p.clientEvents.contains(.headers(stream: id, fields: f([(":status", "103"), ("link", "</a.css>; rel=preload")]), kind: .informational, endStream: false)))
        #expect(p.clientEvents.contains(.headers(stream: id, fields: f([(":status", "204")]), kind: .response, endStream: true)))
    }

    @Test func concurrencyLimitAndResets() throws {
        var s = HTTP2Settings()
        s.maxConcurrentStreams = 3
        let p = try Pair(server: s)
        #expect(p.clientEvents.contains(.remoteSettings(maxConcurrentStreams: 3, enableConnectProtocol: false)))
        #expect(p.client.remoteMaxConcurrentStreams == 3)
        var ids: [Int32] = []
        while p.client.canOpenStream { ids.append(try p.client.submitRequest(getRequest, endStream: true)) }
        #expect(ids.count == 3)
        try p.pump()
        // The client resets one; the server resets another.
        p.client.resetStream(ids[0], error: .cancel)
        p.server.resetStream(ids[1], error: .refusedStream)
        try p.pump()
        #expect(p.serverEvents.contains(.streamClosed(stream: ids[0], errorCode: HTTP2ErrorCode.cancel.rawValue)))
        #expect(p.clientEvents.contains(.streamClosed(stream: ids[1], errorCode: HTTP2ErrorCode.refusedStream.rawValue)))
        #expect(p.client.openStreamCount == 1)
        #expect(p.client.canOpenStream)
    }

    /// GOAWAY: the client learns the last stream processed; streams above it close as refused
    /// (they were not processed and may be retried elsewhere).
    @Test func goAwayRefusesStreamsAboveTheLastOne() throws {
        let p = try Pair()
        let a = try p.client.submitRequest(getRequest, endStream: true)
        try p.pump()
        let b = try p.client.submitRequest(getRequest, endStream: true)
        p.server.goAway(error: .noError, lastStreamID: a)
        try p.pump()
        #expect(p.clientEvents.contains(.goAway(lastStreamID: a, errorCode: 0)))
        #expect(p.clientEvents.contains(.streamClosed(stream: b, errorCode: HTTP2ErrorCode.refusedStream.rawValue)))
        #expect(!p.client.canOpenStream)
        #expect(throws: HTTP2Error.self) { try p.client.submitRequest(getRequest, endStream: true) }
    }

    @Test func pingIsAcknowledged() throws {
        let p = try Pair()
        p.client.ping()
        try p.pump()
        #expect(p.clientEvents.contains(.pingAck))
    }

    @Test func extendedConnectWhenTheServerEnablesIt() throws {
        var s = HTTP2Settings()
        s.enableConnectProtocol = true
        let p = try Pair(server: s)
        #expect(p.client.peerEnablesConnectProtocol)
        let ws = f([(":method", "CONNECT"), (":protocol", "websocket"), (":scheme", "https"), (":authority", "a"), (":path", "/chat"), ("sec-websocket-version", "13")])
        let id = try p.client.submitRequest(ws, endStream: false)
        try p.pump()
        #expect(p.serverEvents.contains(.headers(stream: id, fields: ws, kind: .request, endStream: false)))
        let r = try HTTP2HeaderMapping.request(from: ws)
        #expect(r.extendedProtocol == "websocket")
        #expect(r.head.target == "/chat")
    }

    @Test func garbageIsAConnectionErrorNotACrash() throws {
        let server = try HTTP2Session(role: .server)
        #expect(throws: HTTP2Error.self) { try server.receive(Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n".utf8)) }
        let valid = try HTTP2Session(role: .server)
        var preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)
        // A HEADERS frame on stream 2 (even: server-initiated) is a connection error: GOAWAY
        // queued, nothing more read.
        preface += [0, 0, 0, 0x04, 0, 0, 0, 0, 0]  // empty SETTINGS
        preface += [0, 0, 1, 0x01, 0x05, 0, 0, 0, 2, 0x82]
        try? valid.receive(preface)
        var out: [UInt8] = []
        try valid.produce(into: &out)
        var types: [UInt8] = []
        var i = 0
        while i + 9 <= out.count {
            let len = Int(out[i]) << 16 | Int(out[i + 1]) << 8 | Int(out[i + 2])
            types.append(out[i + 3])
            i += 9 + len
        }
        #expect(types.last == 0x07)  // GOAWAY
        #expect(!valid.wantsRead)
        #expect(valid.isFinished)
    }

    /// An oversized request head is reported (for a 431), not reset; an oversized response head
    /// (client role) still resets the stream.
    @Test func oversizedHeaderBlocks() throws {
        var s = HTTP2Settings()
        s.maxHeaderListSize = 1024
        let p = try Pair(client: s, server: s)
        var big = getRequest
        big.append(HTTPField(name: "x-big", value: String(repeating: "a", count: 4000)))
        let id = try p.client.submitRequest(big, endStream: true)
        try p.pump()
        #expect(!p.serverEvents.contains { if case .headers(id, _, _, _) = $0 { return true }; return false })
        #expect(p.serverEvents.contains(.requestHeadRefused(stream: id, limit: .size, endStream: true)))
        try p.server.submitResponse(stream: id, [HTTPField(name: ":status", value: "200"),
                                                 HTTPField(name: "x-big", value: String(repeating: "b", count: 4000))], endStream: true)
        try p.pump()
        #expect(!p.clientEvents.contains { if case .headers(id, _, _, _) = $0 { return true }; return false })
        #expect(p.clientEvents.contains { if case .streamClosed(id, let code) = $0 { return code != 0 }; return false })
    }

    /// Names leave lower-cased whatever case they were given in (RFC 9113 §8.2.1), and a
    /// credential field is never-indexed whatever its case, `sensitive:` names included: the
    /// encoder finds them by bytes, not by a lower-cased copy of each name.
    @Test func namesLeaveLowerCasedAndCredentialsOfAnyCaseNeverIndexed() throws {
        let p = try Pair()
        let request = f([(":method", "GET"), (":scheme", "http"), (":authority", "api.example"), (":path", "/"),
                         ("X-Api-Key", "k1"), ("Accept", "*/*")])
        let id = try p.client.submitRequest(request, endStream: true, sensitive: "x-API-key")
        try p.pump()
        let lowered = f([(":method", "GET"), (":scheme", "http"), (":authority", "api.example"), (":path", "/"),
                         ("x-api-key", "k1"), ("accept", "*/*")])
        #expect(p.serverEvents.contains(.headers(stream: id, fields: lowered, kind: .request, endStream: true)))
        try p.server.submitResponse(stream: id, f([(":status", "200"), ("Content-Type", "text/plain"), ("SET-COOKIE", "s=1")]), endStream: true)
        try p.pump()
        #expect(p.clientEvents.contains(.headers(stream: id, fields: f([(":status", "200"), ("content-type", "text/plain"), ("set-cookie", "s=1")]),
                                                 kind: .response, endStream: true)))

        func secondBlockSize(_ request: [HTTPField], sensitive: String?) throws -> Int {
            let p = try Pair()
            _ = try p.client.submitRequest(request, endStream: true, sensitive: sensitive)
            try p.pump()
            p.clientWire.removeAll()
            _ = try p.client.submitRequest(request, endStream: true, sensitive: sensitive)
            try p.pump()
            return p.clientWire.count
        }
        let base = Array(request.prefix(4))
        for (name, sensitive) in [("Authorization", nil), ("COOKIE", nil), ("DPoP", nil), ("X-Api-Key", "x-api-KEY")] as [(String, String?)] {
            let with = try secondBlockSize(base + [HTTPField(name: name, value: "credential-value")], sensitive: sensitive)
            let without = try secondBlockSize(base, sensitive: sensitive)
            // Indexed, the field would cost one byte the second time; never-indexed, its literal again.
            #expect(with - without >= 8, "\(name)")
        }
        // Not a credential: indexed, so the second block costs a byte or so more.
        let plain = try secondBlockSize(base + [HTTPField(name: "X-Trace", value: "credential-value")], sensitive: nil)
        #expect(plain - (try secondBlockSize(base, sensitive: nil)) <= 2)
    }

    /// A header block too big for one frame goes out as HEADERS and CONTINUATION frames and
    /// arrives whole, in order, while another stream's block arrives before and after it.
    @Test func aHeaderBlockSpanningContinuationFramesArrivesWhole() throws {
        let p = try Pair()
        var big = getRequest
        for i in 0..<300 { big.append(HTTPField(name: "x-field-\(i)", value: String(repeating: "v", count: 100) + "\(i)")) }
        let first = try p.client.submitRequest(getRequest, endStream: true)
        let id = try p.client.submitRequest(big, endStream: true)
        let last = try p.client.submitRequest(getRequest, endStream: true)
        try p.pump()
        let heads = p.serverEvents.compactMap { e -> (Int32, [HTTPField])? in
            if case .headers(let s, let fields, .request, true) = e { return (s, fields) }
            return nil
        }
        #expect(heads.map(\.0) == [first, id, last])
        #expect(heads.first { $0.0 == id }?.1 == big)
        #expect(heads.first { $0.0 == last }?.1 == getRequest)
    }
}
