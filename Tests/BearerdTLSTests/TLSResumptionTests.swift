// Client session resumption (docs/architecture.md §2.3): sessions and TLS 1.3 tickets are kept per
// context and host:port, offered on the next connection, dropped when the server declines them.

import Testing
import BearerdTestSupport
@testable import BearerdTLS

@Suite struct TLSResumptionTests {
    /// One connection through `client` to a server of `serverContext`: the handshake, one request
    /// and one answer (so the TLS 1.3 tickets, sent after the handshake, reach the client).
    static func connect(_ client: TLSContext, _ serverContext: TLSContext, port: UInt16?) throws -> TLSEngine {
        let link = TLSLink(client: try TLSEngine(client: client, serverName: "localhost", port: port),
                           server: try TLSEngine(server: serverContext))
        link.run()
        try link.client.write(Array("ping".utf8))
        link.run()
        try link.server.write(Array("pong".utf8))
        link.run()
        #expect(link.client.error == nil && link.server.error == nil)
        #expect(link.client.received == Array("pong".utf8))
        return link.client.engine
    }

    @Test(arguments: [false, true])
    func secondConnectionResumesTheFirstsSession(tls12: Bool) throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let client = try TLSContext.client(caFile: pki.caFile, clientCert: nil, clientKey: nil, alpn: [], maximumTLS12: tls12)
        let server = try pki.serverContext(alpn: [])
        let before = TLSHandshakeStats.snapshot["localhost:8443"] ?? .init()
        let first = try Self.connect(client, server, port: 8443)
        #expect(!first.resumedSession)
        #expect(first.negotiatedProtocolVersion == (tls12 ? "TLSv1.2" : "TLSv1.3"))
        #expect(client.sessionCache?.count == 1)
        let second = try Self.connect(client, server, port: 8443)
        #expect(second.resumedSession, "the kept session was offered and accepted")
        let third = try Self.connect(client, server, port: 8443)
        #expect(third.resumedSession)
        let after = TLSHandshakeStats.snapshot["localhost:8443"] ?? .init()
        #expect(after.full &- before.full >= 1 && after.resumed &- before.resumed >= 2)
    }

    /// Each engine is freed before the next connects, without close_notify (as an upstream that
    /// closes after its answer leaves it): its session must stay resumable.
    @Test func sessionsAreKeptPerPortAndNotOfferedWithoutOne() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let client = try TLSContext.client(caFile: pki.caFile, clientCert: nil, clientKey: nil, alpn: [])
        let server = try pki.serverContext(alpn: [])
        _ = try Self.connect(client, server, port: 1)
        #expect(try !Self.connect(client, server, port: 2).resumedSession, "another port is another peer")
        #expect(try !Self.connect(client, server, port: nil).resumedSession, "no port: no resumption")
        #expect(try Self.connect(client, server, port: 1).resumedSession)
    }

    @Test func aDeclinedSessionIsDroppedThenReplaced() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let client = try TLSContext.client(caFile: pki.caFile, clientCert: nil, clientKey: nil, alpn: [])
        _ = try Self.connect(client, try pki.serverContext(alpn: []), port: 9)
        // A restarted server (new ticket keys) cannot resume: a full handshake, and its new
        // session replaces the declined one.
        let restarted = try pki.serverContext(alpn: [])
        #expect(try !Self.connect(client, restarted, port: 9).resumedSession)
        #expect(try Self.connect(client, restarted, port: 9).resumedSession)
    }

    @Test func theCacheIsBounded() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let client = try TLSContext.client(caFile: pki.caFile, clientCert: nil, clientKey: nil, alpn: [])
        let server = try pki.serverContext(alpn: [])
        let cache = try #require(client.sessionCache)
        for port in 1...UInt16(cache.capacity + 10) { _ = try Self.connect(client, server, port: port) }
        #expect(cache.count == cache.capacity)
        #expect(try !Self.connect(client, server, port: 1).resumedSession, "the oldest peer was evicted")
        #expect(try Self.connect(client, server, port: UInt16(cache.capacity + 10)).resumedSession)
    }
}

