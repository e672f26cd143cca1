// TLSEngine tests without sockets: a client engine and a server engine exchange ciphertext in
// memory through `TLSLink`, which can cut it into chunks as small as one byte.

import Testing
import BearerdTestSupport
@testable import BearerdTLS

/// Carries ciphertext between two engines and records what each side decrypted or failed with.
/// Confined to the test that made it.
final class TLSLink {
    final class Side {
        let engine: TLSEngine
        var error: TLSError?
        var received: [UInt8] = []
        var closed = false
        init(_ engine: TLSEngine) { self.engine = engine }

        var isComplete: Bool { engine.isHandshakeComplete }

        /// Drives the handshake, then reads everything decryptable.
        func drive() {
            guard error == nil else { return }
            do {
                guard try engine.handshake() == .complete else { return }
                var buffer = [UInt8](repeating: 0, count: 16 * 1024)
                reading: while !closed {
                    let result = try buffer.withUnsafeMutableBytes { try engine.readPlaintext(into: $0) }
                    switch result {
                    case .bytes(let count): received += buffer[0..<count]
                    case .wantMore: break reading
                    case .closed: closed = true
                    }
                }
            } catch let failure as TLSError {
                error = failure
            } catch {
                Issue.record("unexpected error type \(error)")
            }
        }

        func write(_ bytes: [UInt8]) throws {
            try bytes.withUnsafeBytes { try engine.writePlaintext($0) }
        }
    }

    let client: Side
    let server: Side
    /// Ciphertext is delivered in pieces of this size, the receiver driven after each piece.
    let chunkSize: Int

    init(client: TLSEngine, server: TLSEngine, chunkSize: Int = .max) {
        self.client = Side(client)
        self.server = Side(server)
        self.chunkSize = chunkSize
    }

    /// Moves ciphertext both ways until nothing moves any more.
    func run(maxRounds: Int = 10_000) {
        client.drive()
        server.drive()
        for _ in 0..<maxRounds {
            let movedUp = deliver(from: client, to: server)
            let movedDown = deliver(from: server, to: client)
            if !movedUp && !movedDown { return }
        }
        Issue.record("the link did not settle")
    }

    @discardableResult
    func deliver(from sender: Side, to receiver: Side) -> Bool {
        var bytes: [UInt8] = []
        sender.engine.drainCiphertext(into: &bytes)
        guard !bytes.isEmpty else { return false }
        var offset = 0
        while offset < bytes.count {
            let end = min(bytes.count, offset + chunkSize)
            bytes[offset..<end].withUnsafeBytes { receiver.engine.feedCiphertext($0) }
            receiver.drive()
            offset = end
        }
        return true
    }
}

private func makePair(
    _ pki: TestPKI, serverName: String = "localhost", clientALPN: [String] = [], serverALPN: [String] = [],
    chunkSize: Int = .max
) throws -> TLSLink {
    let clientContext = try TLSContext.client(caFile: pki.caFile, clientCert: nil, clientKey: nil, alpn: clientALPN)
    let serverContext = try pki.serverContext(alpn: serverALPN)
    return TLSLink(
        client: try TLSEngine(client: clientContext, serverName: serverName),
        server: try TLSEngine(server: serverContext), chunkSize: chunkSize)
}

private func randomBytes(_ count: Int) -> [UInt8] {
    var generator = SystemRandomNumberGenerator()
    return (0..<count).map { _ in UInt8.random(in: 0...255, using: &generator) }
}

@Suite struct TLSEngineTests {
    @Test func handshakeThenDataBothWays() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let link = try makePair(pki, clientALPN: ["h2", "http/1.1"], serverALPN: ["h2", "http/1.1"])
        link.run()
        #expect(link.client.error == nil)
        #expect(link.server.error == nil)
        #expect(link.client.isComplete && link.server.isComplete)
        #expect(link.client.engine.negotiatedALPN == "h2")
        #expect(link.server.engine.negotiatedALPN == "h2")
        #expect(link.client.engine.negotiatedProtocolVersion == "TLSv1.3")
        #expect(link.client.engine.peerCertificateSubject == "CN=localhost")
        #expect(link.server.engine.peerCertificateSubject == nil)

        try link.client.write(Array("GET / HTTP/1.1\r\n\r\n".utf8))
        link.run()
        #expect(link.server.received == Array("GET / HTTP/1.1\r\n\r\n".utf8))
        try link.server.write(Array("HTTP/1.1 204 No Content\r\n\r\n".utf8))
        link.run()
        #expect(link.client.received == Array("HTTP/1.1 204 No Content\r\n\r\n".utf8))

        let up = randomBytes(1 << 20)
        let down = randomBytes(1 << 20)
        link.client.received = []
        link.server.received = []
        try link.client.write(up)
        try link.server.write(down)
        link.run()
        #expect(link.server.received == up)
        #expect(link.client.received == down)
        #expect(link.client.error == nil && link.server.error == nil)
    }

    @Test func tls12HandshakeWorks() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let clientContext = try TLSContext.client(caFile: pki.caFile, clientCert: nil, clientKey: nil, alpn: ["http/1.1"], maximumTLS12: true)
        let link = TLSLink(client: try TLSEngine(client: clientContext, serverName: "localhost"), server: try TLSEngine(server: try pki.serverContext(alpn: ["h2", "http/1.1"])))
        link.run()
        #expect(link.client.error == nil && link.server.error == nil)
        #expect(link.client.engine.negotiatedProtocolVersion == "TLSv1.2")
        #expect(link.client.engine.negotiatedALPN == "http/1.1")
        try link.server.write(Array("pong".utf8))
        link.run()
        #expect(link.client.received == Array("pong".utf8))
    }

    @Test(arguments: [
        (["http/1.1"], ["h2", "http/1.1"], "http/1.1"),
        (["h2", "http/1.1"], ["http/1.1", "h2"], "http/1.1"),  // server preference wins
        (["h2"], ["http/1.1"], nil),  // no overlap: no ALPN, handshake still completes
        ([], ["h2", "http/1.1"], nil),
        (["h2", "http/1.1"], [], nil),
    ] as [([String], [String], String?)])
    func alpnNegotiation(clientALPN: [String], serverALPN: [String], expected: String?) throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let link = try makePair(pki, clientALPN: clientALPN, serverALPN: serverALPN)
        link.run()
        #expect(link.client.error == nil && link.server.error == nil)
        #expect(link.client.isComplete)
        #expect(link.client.engine.negotiatedALPN == expected)
        #expect(link.server.engine.negotiatedALPN == expected)
    }

    @Test func withoutCAFileTheTestCAIsNotTrusted() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let clientContext = try TLSContext.client(caFile: nil, clientCert: nil, clientKey: nil, alpn: [])
        let link = TLSLink(client: try TLSEngine(client: clientContext, serverName: "localhost"), server: try TLSEngine(server: try pki.serverContext()))
        link.run()
        let error = try #require(link.client.error)
        #expect(error.reason == "tls.verify_failed")
        #expect(error.message.contains("unable to get local issuer certificate"))
        #expect(!link.client.isComplete)
        // The client's alert reached the server, whose handshake failed too.
        #expect(link.server.error?.reason == "tls.handshake_failed")
        // A failed engine stays failed.
        #expect(throws: error) { try link.client.engine.handshake() }
    }

    @Test func certificateFromAnotherCAIsRejected() throws {
        let pki = try TestPKI.generate()
        let other = try TestPKI.generate()
        defer { pki.remove(); other.remove() }
        let clientContext = try TLSContext.client(caFile: other.caFile, clientCert: nil, clientKey: nil, alpn: [])
        let link = TLSLink(client: try TLSEngine(client: clientContext, serverName: "localhost"), server: try TLSEngine(server: try pki.serverContext()))
        link.run()
        #expect(link.client.error?.reason == "tls.verify_failed")
    }

    @Test func wrongHostNameIsRejected() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let link = try makePair(pki, serverName: "wrong.example")
        link.run()
        let error = try #require(link.client.error)
        #expect(error.reason == "tls.verify_failed")
        #expect(error.message.contains("hostname mismatch"))
        #expect(error.message.contains("wrong.example"))
    }

    @Test func certificateForAnotherNameIsRejected() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let other = try pki.issueServerCertificate(names: ["other.example"], label: "other")
        let serverContext = try TLSContext.server(certificateChainFile: other.certFile, privateKeyFile: other.keyFile, clientCAFile: nil, requireClientCertificate: false, alpn: [])
        let clientContext = try pki.clientContext()

        let mismatch = TLSLink(client: try TLSEngine(client: clientContext, serverName: "localhost"), server: try TLSEngine(server: serverContext))
        mismatch.run()
        #expect(mismatch.client.error?.reason == "tls.verify_failed")
        #expect(mismatch.client.error?.message.contains("hostname mismatch") == true)

        let match = TLSLink(client: try TLSEngine(client: clientContext, serverName: "other.example"), server: try TLSEngine(server: serverContext))
        match.run()
        #expect(match.client.error == nil)
        #expect(match.client.isComplete)
    }

    @Test func ipLiteralIsVerifiedAgainstTheIPSAN() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let good = try makePair(pki, serverName: "127.0.0.1")
        good.run()
        #expect(good.client.error == nil)
        #expect(good.client.isComplete)

        let bad = try makePair(pki, serverName: "127.0.0.2")
        bad.run()
        #expect(bad.client.error?.reason == "tls.verify_failed")
        #expect(bad.client.error?.message.contains("IP address mismatch") == true)

        let v6 = try makePair(pki, serverName: "[::1]")  // not in the SANs
        v6.run()
        #expect(v6.client.error?.reason == "tls.verify_failed")
    }

    @Test func ipv6SANWithBrackets() throws {
        let pki = try TestPKI.generate(serverNames: ["::1"])
        defer { pki.remove() }
        let link = try makePair(pki, serverName: "[::1]")
        link.run()
        #expect(link.client.error == nil)
        #expect(link.client.isComplete)
    }

    @Test func emptyServerNameIsAConfigurationError() throws {
        let context = try TLSContext.client(caFile: nil, clientCert: nil, clientKey: nil, alpn: [])
        #expect(throws: TLSError.self) { try TLSEngine(client: context, serverName: "") }
        do {
            _ = try TLSEngine(client: context, serverName: "")
        } catch {
            #expect(error.reason == "tls.config")
        }
    }

    @Test func engineRoleMustMatchTheContext() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let clientContext = try pki.clientContext()
        let serverContext = try pki.serverContext()
        #expect(throws: TLSError.self) { try TLSEngine(server: clientContext) }
        #expect(throws: TLSError.self) { try TLSEngine(client: serverContext, serverName: "localhost") }
    }
}

@Suite struct TLSMutualAuthenticationTests {
    @Test(arguments: [false, true])
    func serverSeesTheClientCertificate(pinTLS12: Bool) throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let clientContext = try TLSContext.client(caFile: pki.caFile, clientCert: pki.clientCertFile, clientKey: pki.clientKeyFile, alpn: [], maximumTLS12: pinTLS12)
        let link = TLSLink(client: try TLSEngine(client: clientContext, serverName: "localhost"), server: try TLSEngine(server: try pki.serverContext(requireClientCertificate: true)))
        link.run()
        #expect(link.client.error == nil && link.server.error == nil)
        #expect(link.server.isComplete)
        let subject = try #require(link.server.engine.peerCertificateSubject)
        #expect(subject.contains("bearerd-test-client"))
        try link.client.write(Array("hello".utf8))
        link.run()
        #expect(link.server.received == Array("hello".utf8))
    }

    @Test(arguments: [false, true])
    func clientWithoutCertificateIsRefused(pinTLS12: Bool) throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let clientContext = try TLSContext.client(caFile: pki.caFile, clientCert: nil, clientKey: nil, alpn: [], maximumTLS12: pinTLS12)
        let link = TLSLink(client: try TLSEngine(client: clientContext, serverName: "localhost"), server: try TLSEngine(server: try pki.serverContext(requireClientCertificate: true)))
        link.run()
        let serverError = try #require(link.server.error)
        #expect(serverError.reason == "tls.handshake_failed")
        #expect(serverError.message.contains("peer did not return a certificate"))
        #expect(!link.server.isComplete)
        // TLS 1.2: the client's handshake fails. TLS 1.3: the client finishes its side first and
        // learns of the refusal (the server's alert) on its next read.
        let clientError = try #require(link.client.error)
        #expect(clientError.reason == (pinTLS12 ? "tls.handshake_failed" : "tls.protocol"))
        #expect(clientError.message.contains("alert"))
    }

    @Test func clientCertificateFromAnotherCAIsRefused() throws {
        let pki = try TestPKI.generate()
        let other = try TestPKI.generate()
        defer { pki.remove(); other.remove() }
        let clientContext = try TLSContext.client(caFile: pki.caFile, clientCert: other.clientCertFile, clientKey: other.clientKeyFile, alpn: [])
        let link = TLSLink(client: try TLSEngine(client: clientContext, serverName: "localhost"), server: try TLSEngine(server: try pki.serverContext(requireClientCertificate: true)))
        link.run()
        let serverError = try #require(link.server.error)
        #expect(serverError.reason == "tls.verify_failed")
        #expect(serverError.message.contains("client certificate"))
        #expect(link.client.error != nil)
    }
}

@Suite struct TLSStreamTests {
    @Test func ciphertextDeliveredByteByByte() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let link = try makePair(pki, clientALPN: ["h2"], serverALPN: ["h2"], chunkSize: 1)
        link.run()
        #expect(link.client.error == nil && link.server.error == nil)
        #expect(link.client.isComplete && link.server.isComplete)
        #expect(link.client.engine.negotiatedALPN == "h2")
        let up = randomBytes(40_000)  // spans several records
        try link.client.write(up)
        try link.server.write(Array("down".utf8))
        link.run()
        #expect(link.server.received == up)
        #expect(link.client.received == Array("down".utf8))
    }

    @Test func plaintextWrittenDuringTheHandshakeIsSentAfterIt() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let link = try makePair(pki)
        try link.client.write(Array("early ".utf8))
        try link.client.write(Array("bird".utf8))
        link.run()
        #expect(link.client.error == nil && link.server.error == nil)
        #expect(link.server.received == Array("early bird".utf8))
    }

    @Test func closeNotifyReadsAsClosed() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let link = try makePair(pki)
        link.run()
        try link.client.write(Array("last words".utf8))
        link.client.engine.shutdown()
        link.client.engine.shutdown()  // idempotent
        #expect(link.client.engine.hasPendingCiphertext)
        link.run()
        #expect(link.server.received == Array("last words".utf8))
        #expect(link.server.closed)
        #expect(link.server.error == nil)
        // A closed stream stays closed, and EOF after close_notify is no error.
        link.server.engine.feedEOF()
        var buffer = [UInt8](repeating: 0, count: 64)
        let result = try buffer.withUnsafeMutableBytes { try link.server.engine.readPlaintext(into: $0) }
        #expect(result == .closed)
        #expect(throws: TLSError(reason: "tls.closed", message: "write after shutdown")) {
            try link.client.write(Array("more".utf8))
        }
        let serverWrite = #expect(throws: TLSError.self) { try link.server.write(Array("reply".utf8)) }
        #expect(serverWrite?.reason == "tls.closed")
    }

    @Test func eofWithoutCloseNotifyIsAnError() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let link = try makePair(pki)
        link.run()
        try link.client.write(Array("cut".utf8))
        var bytes: [UInt8] = []
        link.client.engine.drainCiphertext(into: &bytes)
        // Deliver all but the last byte of the record, then EOF.
        bytes.dropLast().withUnsafeBytes { link.server.engine.feedCiphertext($0) }
        link.server.engine.feedEOF()
        link.server.drive()
        let error = try #require(link.server.error)
        #expect(error.reason == "tls.protocol")
        #expect(error.message.contains("unexpected eof"))
    }

    @Test func eofAtARecordBoundaryWithoutCloseNotifyIsAnError() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let link = try makePair(pki)
        link.run()
        try link.client.write(Array("whole".utf8))
        link.run()
        #expect(link.server.received == Array("whole".utf8))
        link.server.engine.feedEOF()
        link.server.drive()
        #expect(link.server.error?.reason == "tls.protocol")
        #expect(link.server.error?.message.contains("unexpected eof") == true)
    }

    @Test func eofDuringTheHandshakeFailsIt() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let link = try makePair(pki)
        link.client.drive()
        link.deliver(from: link.client, to: link.server)  // ClientHello
        link.client.engine.feedEOF()  // the server "hangs up" before answering
        link.client.drive()
        let error = try #require(link.client.error)
        #expect(error.reason == "tls.handshake_failed")
        #expect(error.message.contains("closed during the handshake"))
    }

    @Test func garbageIsAHandshakeFailure() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let server = try TLSEngine(server: try pki.serverContext())
        let garbage = Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n".utf8)
        garbage.withUnsafeBytes { server.feedCiphertext($0) }
        let error = #expect(throws: TLSError.self) { try server.handshake() }
        #expect(error?.reason == "tls.handshake_failed")
        #expect(error?.message.isEmpty == false)
    }
}

@Suite struct TLSConfigurationTests {
    @Test func missingCAFileNamesThePath() throws {
        let path = "/nonexistent/bearerd/ca.pem"
        let error = #expect(throws: TLSError.self) {
            try TLSContext.client(caFile: path, clientCert: nil, clientKey: nil, alpn: [])
        }
        #expect(error?.reason == "tls.config")
        #expect(error?.message.contains(path) == true)
        #expect(error?.message.contains("ca_file") == true)
    }

    @Test func caFileWithoutCertificatesIsRejected() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        // A key file holds no certificate.
        let error = #expect(throws: TLSError.self) {
            try TLSContext.client(caFile: pki.clientKeyFile, clientCert: nil, clientKey: nil, alpn: [])
        }
        #expect(error?.reason == "tls.config")
        #expect(error?.message.contains(pki.clientKeyFile) == true)
    }

    @Test func mismatchedClientKeyNamesTheFile() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let error = #expect(throws: TLSError.self) {
            try TLSContext.client(caFile: pki.caFile, clientCert: pki.clientCertFile, clientKey: pki.serverKeyFile, alpn: [])
        }
        #expect(error?.reason == "tls.config")
        #expect(error?.message.contains(pki.serverKeyFile) == true)
        #expect(error?.message.contains("does not match") == true)
    }

    @Test func missingClientCertificateAndKeyNameThePath() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let missingCert = #expect(throws: TLSError.self) {
            try TLSContext.client(caFile: nil, clientCert: "/nonexistent/client.pem", clientKey: pki.clientKeyFile, alpn: [])
        }
        #expect(missingCert?.reason == "tls.config")
        #expect(missingCert?.message.contains("/nonexistent/client.pem") == true)
        let missingKey = #expect(throws: TLSError.self) {
            try TLSContext.client(caFile: nil, clientCert: pki.clientCertFile, clientKey: "/nonexistent/client.key", alpn: [])
        }
        #expect(missingKey?.reason == "tls.config")
        #expect(missingKey?.message.contains("/nonexistent/client.key") == true)
        let keyAlone = #expect(throws: TLSError.self) {
            try TLSContext.client(caFile: nil, clientCert: nil, clientKey: pki.clientKeyFile, alpn: [])
        }
        #expect(keyAlone?.reason == "tls.config")
    }

    @Test func serverConfigurationErrors() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let missing = #expect(throws: TLSError.self) {
            try TLSContext.server(certificateChainFile: "/nonexistent/server.pem", privateKeyFile: pki.serverKeyFile, clientCAFile: nil, requireClientCertificate: false, alpn: [])
        }
        #expect(missing?.reason == "tls.config")
        #expect(missing?.message.contains("/nonexistent/server.pem") == true)
        let mismatch = #expect(throws: TLSError.self) {
            try TLSContext.server(certificateChainFile: pki.serverCertFile, privateKeyFile: pki.clientKeyFile, clientCAFile: nil, requireClientCertificate: false, alpn: [])
        }
        #expect(mismatch?.reason == "tls.config")
        #expect(mismatch?.message.contains(pki.clientKeyFile) == true)
        let noCA = #expect(throws: TLSError.self) {
            try TLSContext.server(certificateChainFile: pki.serverCertFile, privateKeyFile: pki.serverKeyFile, clientCAFile: nil, requireClientCertificate: true, alpn: [])
        }
        #expect(noCA?.reason == "tls.config")
    }

    @Test func badALPNNamesAreRejected() {
        let empty = #expect(throws: TLSError.self) {
            try TLSContext.client(caFile: nil, clientCert: nil, clientKey: nil, alpn: [""])
        }
        #expect(empty?.reason == "tls.config")
        #expect(throws: TLSError.self) {
            try TLSContext.client(caFile: nil, clientCert: nil, clientKey: nil, alpn: [String(repeating: "x", count: 256)])
        }
    }

    @Test func alpnSelectionPrefersTheServerOrder() throws {
        let list = try ALPNList(["h2", "http/1.1"])
        let offered: [UInt8] = [8] + Array("http/1.1".utf8) + [2] + Array("h2".utf8)
        let range = offered.withUnsafeBufferPointer { list.select(offered: $0) }
        #expect(range == 10..<12)
        let malformed: [UInt8] = [9] + Array("h2".utf8)
        #expect(malformed.withUnsafeBufferPointer { list.select(offered: $0) } == nil)
    }
}
