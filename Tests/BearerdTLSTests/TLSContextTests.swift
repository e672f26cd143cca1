// TLSContext options beyond the basic handshake: optional client certificates, a certificate and
// key in one file, the protocol floor, absolute DNS names.

import Foundation
import Testing
import BearerdTestSupport
@testable import BearerdTLS

@Suite struct TLSContextOptionTests {
    @Test func contextsRequireTLS12OrLater() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        #expect(try pki.clientContext().minimumProtocolVersion == "TLSv1.2")
        #expect(try pki.serverContext().minimumProtocolVersion == "TLSv1.2")
        #expect(try TLSContext.client(caFile: nil, clientCert: nil, clientKey: nil, alpn: []).minimumProtocolVersion == "TLSv1.2")
    }

    @Test func optionalClientCertificate() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let serverContext = try TLSContext.server(
            certificateChainFile: pki.serverCertFile, privateKeyFile: pki.serverKeyFile,
            clientCAFile: pki.caFile, requireClientCertificate: false, alpn: [])

        let anonymous = TLSLink(client: try TLSEngine(client: try pki.clientContext(), serverName: "localhost"), server: try TLSEngine(server: serverContext))
        anonymous.run()
        #expect(anonymous.client.error == nil && anonymous.server.error == nil)
        #expect(anonymous.server.isComplete)
        #expect(anonymous.server.engine.peerCertificateSubject == nil)

        let identified = TLSLink(client: try TLSEngine(client: try pki.clientContext(presentClientCertificate: true), serverName: "localhost"), server: try TLSEngine(server: serverContext))
        identified.run()
        #expect(identified.server.error == nil)
        #expect(identified.server.engine.peerCertificateSubject == "CN=\(TestPKI.clientCommonName)")
    }

    @Test func clientCertificateAndKeyInOneFile() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let combined = pki.directory + "/client-combined.pem"
        let bytes = try Data(contentsOf: URL(fileURLWithPath: pki.clientCertFile)) + Data(contentsOf: URL(fileURLWithPath: pki.clientKeyFile))
        try bytes.write(to: URL(fileURLWithPath: combined))
        let clientContext = try TLSContext.client(caFile: pki.caFile, clientCert: combined, clientKey: nil, alpn: [])
        let link = TLSLink(client: try TLSEngine(client: clientContext, serverName: "localhost"), server: try TLSEngine(server: try pki.serverContext(requireClientCertificate: true)))
        link.run()
        #expect(link.server.error == nil)
        #expect(link.server.engine.peerCertificateSubject?.contains(TestPKI.clientCommonName) == true)
    }

    @Test func absoluteDNSNameIsVerifiedWithoutItsDot() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let engine = try TLSEngine(client: try pki.clientContext(), serverName: "localhost.")
        #expect(engine.serverName == "localhost")
        let link = TLSLink(client: engine, server: try TLSEngine(server: try pki.serverContext()))
        link.run()
        #expect(link.client.error == nil)
        #expect(link.client.isComplete)
    }

    @Test func anotherClientCertificateFromTheSameCA() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let files = try pki.issueClientCertificate(commonName: "second-client", label: "second")
        let clientContext = try TLSContext.client(caFile: pki.caFile, clientCert: files.certFile, clientKey: files.keyFile, alpn: [])
        let link = TLSLink(client: try TLSEngine(client: clientContext, serverName: "localhost"), server: try TLSEngine(server: try pki.serverContext(requireClientCertificate: true)))
        link.run()
        #expect(link.server.error == nil)
        #expect(link.server.engine.peerCertificateSubject == "CN=second-client")
    }

    @Test func testPKIWritesKeysPrivately() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let attributes = try FileManager.default.attributesOfItem(atPath: pki.serverKeyFile)
        #expect((attributes[.posixPermissions] as? NSNumber)?.intValue == 0o600)
        let pem = try String(contentsOfFile: pki.caFile, encoding: .utf8)
        #expect(pem.hasPrefix("-----BEGIN CERTIFICATE-----"))
        pki.remove()
        #expect(!FileManager.default.fileExists(atPath: pki.directory))
    }
}

@Suite struct TLSTrustAnchorTests {
    @Test func serverCertificateAloneInCAFileIsATrustAnchor() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let pinned = try TLSContext.client(caFile: pki.serverCertFile, clientCert: nil, clientKey: nil, alpn: [])
        let link = TLSLink(client: try TLSEngine(client: pinned, serverName: "localhost"), server: try TLSEngine(server: try pki.serverContext()))
        link.run()
        #expect(link.client.error == nil)
        #expect(link.client.isComplete)
        // The host name is still checked against the anchored certificate.
        let wrong = TLSLink(client: try TLSEngine(client: pinned, serverName: "wrong.example"), server: try TLSEngine(server: try pki.serverContext()))
        wrong.run()
        #expect(wrong.client.error?.reason == "tls.verify_failed")
        #expect(wrong.client.error?.message.contains("hostname mismatch") == true)
    }
}
