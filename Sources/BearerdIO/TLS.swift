// STUB: to be replaced by the OpenSSL memory-BIO engine (owned by the TLS helper).

/// A TLS failure with a stable reason (`tls.verify_failed`, `tls.handshake_failed`, `tls.config`,
/// `tls.protocol`) and a human message carrying OpenSSL's verification reason.
public struct TLSError: Error, Sendable, CustomStringConvertible {
    public var reason: String
    public var message: String
    public init(reason: String, message: String) {
        self.reason = reason
        self.message = message
    }
    public var description: String { "\(reason): \(message)" }
}

/// An immutable `SSL_CTX` wrapper, shareable across loops.
public final class TLSContext: @unchecked Sendable {
    public static func client(caFile: String?, clientCert: String?, clientKey: String?, alpn: [String]) throws(TLSError) -> TLSContext {
        TLSContext()
    }
    public static func server(certificateChainFile: String, privateKeyFile: String, clientCAFile: String?, requireClientCertificate: Bool, alpn: [String]) throws(TLSError) -> TLSContext {
        TLSContext()
    }
}

/// One TLS connection over memory BIOs; confined to its connection's loop.
public final class TLSEngine {
    public enum HandshakeState: Equatable { case complete, inProgress }
    public enum ReadResult: Equatable { case bytes(Int), wantMore, closed }
    public init(client context: TLSContext, serverName: String) throws(TLSError) {}
    public init(server context: TLSContext) throws(TLSError) {}
    public func feedCiphertext(_ bytes: UnsafeRawBufferPointer) {}
    public func feedEOF() {}
    public func handshake() throws(TLSError) -> HandshakeState { .complete }
    public func readPlaintext(into buffer: UnsafeMutableRawBufferPointer) throws(TLSError) -> ReadResult { .wantMore }
    public func writePlaintext(_ bytes: UnsafeRawBufferPointer) throws(TLSError) {}
    public func drainCiphertext(into buffer: inout [UInt8]) {}
    public var hasPendingCiphertext: Bool { false }
    public func shutdown() {}
    public var negotiatedALPN: String? { nil }
    public var peerCertificateSubject: String? { nil }
}
