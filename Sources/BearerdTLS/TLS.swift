// TLS through the system OpenSSL 3, over memory BIOs (docs/architecture.md §2.3).
//
// Theory of operation. A `TLSContext` wraps one configured, then immutable, `SSL_CTX`. A
// `TLSEngine` wraps one `SSL` with two `BIO_s_mem()`: the shell writes the bytes it read from the
// socket into the engine (`feedCiphertext`), drives it (`handshake`, `readPlaintext`,
// `writePlaintext`, `shutdown`) and, after EVERY call (whether it returned or threw), moves what
// the engine produced to the socket (`drainCiphertext`). The engine never touches a file
// descriptor, a clock or a thread; no C callback does I/O.
//
// Errors. Every SSL call is preceded by `ERR_clear_error()` and its failure goes through one
// function, `TLSEngine.classify`, which maps `SSL_get_error`:
//   WANT_READ / WANT_WRITE -> in progress (feed more ciphertext, or drain),
//   ZERO_RETURN            -> the peer's close_notify,
//   SSL / SYSCALL          -> a `TLSError` carrying the error queue text, `tls.verify_failed`
//                             with `X509_verify_cert_error_string` when verification failed.
// An engine that failed stays failed: every later call throws the same error.

import CBearerdShim
import COpenSSL

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A TLS failure with a stable reason and a human message carrying OpenSSL's own words.
///
/// Reasons: `tls.verify_failed` (chain or host name; the message carries
/// `X509_verify_cert_error_string`, e.g. "unable to get local issuer certificate",
/// "hostname mismatch"), `tls.handshake_failed`, `tls.config` (a file that cannot be loaded, a key
/// that does not match its certificate; the message names the file), `tls.protocol` (a failure
/// after the handshake, including a stream cut without close_notify), `tls.closed` (writing after
/// close_notify was sent or received).
public struct TLSError: Error, Sendable, CustomStringConvertible, Equatable {
    public var reason: String
    public var message: String
    public init(reason: String, message: String) {
        self.reason = reason
        self.message = message
    }
    public var description: String { "\(reason): \(message)" }

    static func config(_ message: String) -> TLSError { TLSError(reason: "tls.config", message: message) }
}

/// The OpenSSL error queue of the calling thread, read once and emptied.
enum OpenSSLErrorQueue {
    /// Pops every queued error (oldest, i.e. the root cause, first) and returns their reason
    /// strings joined by "; " (empty when the queue was empty): `strerror` text for system errors,
    /// the full `ERR_error_string_n` text for unknown reasons. Wrapper reasons ("system lib",
    /// "PEM lib") and repeats ("no such file" after "No such file or directory") are left out.
    static func drain() -> String {
        var parts: [String] = []
        while true {
            let code = ERR_get_error()
            if code == 0 { break }
            let text: String
            let systemFlag = UInt(UInt32(Int32.max) + 1)  // ERR_SYSTEM_FLAG, a macro Swift cannot import
            if code & systemFlag != 0 {
                text = String(cString: strerror(Int32(truncatingIfNeeded: code & (systemFlag - 1))))
            } else if let reason = ERR_reason_error_string(code) {
                text = String(cString: reason)
            } else {
                var buffer = [CChar](repeating: 0, count: 256)
                ERR_error_string_n(code, &buffer, buffer.count)
                text = String(cString: buffer)
            }
            let lowered = text.lowercased()
            if parts.contains(where: { $0.lowercased().contains(lowered) }) { continue }
            parts.append(text)
        }
        let specific = parts.filter { !$0.hasSuffix(" lib") }
        return (specific.isEmpty ? parts : specific).joined(separator: "; ")
    }

    /// `prefix: <queue>` or `prefix: <fallback>` when the queue is empty.
    static func message(_ prefix: String, fallback: String = "unknown OpenSSL error") -> String {
        let queue = drain()
        return "\(prefix): \(queue.isEmpty ? fallback : queue)"
    }
}

/// The ALPN protocol list of one context, in preference order, and its RFC 7301 §3.1 wire form
/// (each name prefixed by its one-byte length). Immutable; kept alive by its `TLSContext`, which
/// hands it to the server's selection callback through `Unmanaged` (no copy per handshake).
final class ALPNList {
    let protocols: [[UInt8]]
    let wire: [UInt8]

    init(_ names: [String]) throws(TLSError) {
        var protocols: [[UInt8]] = []
        var wire: [UInt8] = []
        for name in names {
            let bytes = Array(name.utf8)
            guard !bytes.isEmpty, bytes.count <= 255 else {
                throw .config("ALPN protocol name \"\(name)\" must be 1 to 255 bytes")
            }
            protocols.append(bytes)
            wire.append(UInt8(bytes.count))
            wire.append(contentsOf: bytes)
        }
        self.protocols = protocols
        self.wire = wire
    }

    /// The first of our protocols (server preference) that the client offered in `offered` (wire
    /// form); returns its range inside `offered`.
    func select(offered: UnsafeBufferPointer<UInt8>) -> Range<Int>? {
        for candidate in protocols {
            var index = 0
            while index < offered.count {
                let length = Int(offered[index])
                let start = index + 1
                let end = start + length
                guard end <= offered.count else { return nil }  // malformed list: no match
                if length == candidate.count, candidate.elementsEqual(offered[start..<end]) {
                    return start..<end
                }
                index = end
            }
        }
        return nil
    }
}

/// RFC 7301 §3.2 server-side selection. No I/O: it only points `out` into the client's list.
private let alpnSelectCallback:
    @convention(c) (
        OpaquePointer?, UnsafeMutablePointer<UnsafePointer<UInt8>?>?, UnsafeMutablePointer<UInt8>?,
        UnsafePointer<UInt8>?, UInt32, UnsafeMutableRawPointer?
    ) -> Int32 = { _, out, outLength, offered, offeredLength, argument in
        guard let out, let outLength, let offered, let argument else { return SSL_TLSEXT_ERR_NOACK }
        let list = Unmanaged<ALPNList>.fromOpaque(argument).takeUnretainedValue()
        let buffer = UnsafeBufferPointer(start: offered, count: Int(offeredLength))
        guard let range = list.select(offered: buffer) else { return SSL_TLSEXT_ERR_NOACK }
        out.pointee = offered + range.lowerBound
        outLength.pointee = UInt8(range.count)
        return SSL_TLSEXT_ERR_OK
    }

/// An immutable `SSL_CTX`, configured once and then shared by every loop.
///
/// Owns: the `SSL_CTX` (freed in `deinit`) and, on a server, the `ALPNList` its selection callback
/// reads. Invariant: nothing mutates the `SSL_CTX` after the factory returns, and every
/// `TLSEngine` keeps its context alive, so the callback argument outlives every `SSL`.
///
/// Client defaults (none can be turned off): TLS ≥ 1.2; the peer chain is verified against the
/// system trust store (`SSL_CTX_set_default_verify_paths`, which honours `SSL_CERT_FILE` /
/// `SSL_CERT_DIR`) plus `caFile` when given; the host name is checked by each engine.
public final class TLSContext: @unchecked Sendable {  // @unchecked: the SSL_CTX is immutable after configuration and OpenSSL makes SSL_new on it thread-safe.
    public enum Role: Sendable, Equatable { case client, server }

    let context: OpaquePointer
    public let role: Role
    /// The ALPN protocols offered (client) or accepted (server), in preference order.
    public let alpn: [String]
    private let alpnList: ALPNList?
    /// A client context's sessions for resumption (nil on a server).
    public let sessionCache: TLSSessionCache?

    /// The lowest protocol version the context accepts ("TLSv1.2").
    public var minimumProtocolVersion: String {
        switch bearerd_SSL_CTX_get_min_proto_version(context) {
        case bearerd_TLS1_2_VERSION(): return "TLSv1.2"
        case bearerd_TLS1_3_VERSION(): return "TLSv1.3"
        case let other: return "0x\(String(other, radix: 16))"
        }
    }

    private init(context: OpaquePointer, role: Role, alpn: [String], alpnList: ALPNList?) {
        self.context = context
        self.role = role
        self.alpn = alpn
        self.alpnList = alpnList
        sessionCache = role == .client ? TLSSessionCache() : nil
    }

    deinit {
        SSL_CTX_free(context)
    }

    /// A client context.
    /// - Parameters:
    ///   - caFile: PEM file of extra trust anchors, ADDED to the system trust store; any certificate
///     in it anchors a chain (`X509_V_FLAG_PARTIAL_CHAIN`), so an intermediate CA or the server's
///     own certificate may be given.
    ///   - clientCert: PEM certificate chain (leaf first) presented for mTLS.
    ///   - clientKey: PEM private key of `clientCert`; when nil the key is read from `clientCert`.
    ///   - alpn: protocols offered, in preference order (e.g. `["h2", "http/1.1"]`); empty: no ALPN.
    public static func client(caFile: String?, clientCert: String?, clientKey: String?, alpn: [String]) throws(TLSError) -> TLSContext {
        try client(caFile: caFile, clientCert: clientCert, clientKey: clientKey, alpn: alpn, maximumTLS12: false)
    }

    /// `maximumTLS12` exists for tests that exercise the TLS 1.2 handshake.
    static func client(caFile: String?, clientCert: String?, clientKey: String?, alpn: [String], maximumTLS12: Bool) throws(TLSError) -> TLSContext {
        let list = try alpn.isEmpty ? nil : ALPNList(alpn)
        let context = try makeContext(method: TLS_client_method(), maximumTLS12: maximumTLS12)
        do throws(TLSError) {
            ERR_clear_error()
            guard SSL_CTX_set_default_verify_paths(context) == 1 else {
                throw .config(OpenSSLErrorQueue.message("cannot load the system trust store"))
            }
            if let caFile {
                try loadVerifyLocations(context, file: caFile, key: "ca_file")
                // As curl does: a certificate in ca_file is a trust anchor even when it is not a
                // self-signed root (a private intermediate CA, or a pinned server certificate).
                // The chain below it and the host name are still verified.
                _ = X509_VERIFY_PARAM_set_flags(SSL_CTX_get0_param(context), UInt(X509_V_FLAG_PARTIAL_CHAIN))
            }
            SSL_CTX_set_verify(context, SSL_VERIFY_PEER, nil)
            if let clientCert {
                try useCertificateAndKey(context, certificateFile: clientCert, keyFile: clientKey ?? clientCert, certificateKey: "client_cert", keyKey: "client_key")
            } else if let clientKey {
                throw .config("client_key \(clientKey) given without client_cert")
            }
            // Resumption (RFC 8446 §2.2, RFC 5077): sessions and TLS 1.3 tickets go to the
            // engine's cache through the new-session callback, never OpenSSL's internal store.
            _ = bearerd_SSL_CTX_set_client_session_cache(context)
            SSL_CTX_sess_set_new_cb(context, newSessionCallback)
            if let list {
                // SSL_CTX_set_alpn_protos returns 0 on success (unlike most of the API).
                let rc = list.wire.withUnsafeBufferPointer { SSL_CTX_set_alpn_protos(context, $0.baseAddress, UInt32($0.count)) }
                guard rc == 0 else { throw .config(OpenSSLErrorQueue.message("cannot set the ALPN protocols")) }
            }
        } catch {
            SSL_CTX_free(context)
            throw error
        }
        return TLSContext(context: context, role: .client, alpn: alpn, alpnList: list)
    }

    /// A server context (bearerd's tests use it for TLS origins; the proxy's listeners are plain).
    /// - Parameters:
    ///   - certificateChainFile: PEM chain, leaf first.
    ///   - privateKeyFile: PEM key of the leaf; checked against it.
    ///   - clientCAFile: trust anchors for client certificates, also sent as the acceptable CA list.
    ///   - requireClientCertificate: fail the handshake when the client sends no certificate
    ///     (needs `clientCAFile`). With `clientCAFile` alone a certificate is requested and, when
    ///     sent, verified.
    ///   - alpn: protocols accepted, in server preference order.
    public static func server(certificateChainFile: String, privateKeyFile: String, clientCAFile: String?, requireClientCertificate: Bool, alpn: [String]) throws(TLSError) -> TLSContext {
        let list = try alpn.isEmpty ? nil : ALPNList(alpn)
        let context = try makeContext(method: TLS_server_method(), maximumTLS12: false)
        do throws(TLSError) {
            try useCertificateAndKey(context, certificateFile: certificateChainFile, keyFile: privateKeyFile, certificateKey: "certificate", keyKey: "private_key")
            // Needed for session resumption when client certificates are verified.
            let sessionContext: [UInt8] = Array("bearerd".utf8)
            _ = SSL_CTX_set_session_id_context(context, sessionContext, UInt32(sessionContext.count))
            if let clientCAFile {
                try loadVerifyLocations(context, file: clientCAFile, key: "client_ca_file")
                ERR_clear_error()
                guard let names = SSL_load_client_CA_file(clientCAFile) else {
                    throw .config(OpenSSLErrorQueue.message("cannot load client_ca_file \(clientCAFile)"))
                }
                SSL_CTX_set_client_CA_list(context, names)  // takes ownership of `names`
                let mode = requireClientCertificate ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT : SSL_VERIFY_PEER
                SSL_CTX_set_verify(context, mode, nil)
            } else if requireClientCertificate {
                throw .config("requiring a client certificate needs a client_ca_file")
            }
        } catch {
            SSL_CTX_free(context)
            throw error
        }
        let result = TLSContext(context: context, role: .server, alpn: alpn, alpnList: list)
        if let list {
            SSL_CTX_set_alpn_select_cb(context, alpnSelectCallback, Unmanaged.passUnretained(list).toOpaque())
        }
        return result
    }

    private static func makeContext(method: OpaquePointer?, maximumTLS12: Bool) throws(TLSError) -> OpaquePointer {
        ERR_clear_error()
        guard let context = SSL_CTX_new(method) else {
            throw .config(OpenSSLErrorQueue.message("SSL_CTX_new failed"))
        }
        guard bearerd_SSL_CTX_set_min_proto_version(context, bearerd_TLS1_2_VERSION()) == 1 else {
            SSL_CTX_free(context)
            throw .config(OpenSSLErrorQueue.message("cannot require TLS 1.2"))
        }
        if maximumTLS12 {
            _ = bearerd_SSL_CTX_set_max_proto_version(context, bearerd_TLS1_2_VERSION())
        }
        // Memory BIOs: a retried SSL_write may come from a different address; release idle buffers.
        _ = bearerd_SSL_CTX_set_mode(context, bearerd_SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER() | bearerd_SSL_MODE_RELEASE_BUFFERS())
        return context
    }

    private static func loadVerifyLocations(_ context: OpaquePointer, file: String, key: String) throws(TLSError) {
        ERR_clear_error()
        guard SSL_CTX_load_verify_locations(context, file, nil) == 1 else {
            throw .config(OpenSSLErrorQueue.message("cannot load \(key) \(file)", fallback: "no certificate found"))
        }
    }

    private static func useCertificateAndKey(_ context: OpaquePointer, certificateFile: String, keyFile: String, certificateKey: String, keyKey: String) throws(TLSError) {
        ERR_clear_error()
        guard SSL_CTX_use_certificate_chain_file(context, certificateFile) == 1 else {
            throw .config(OpenSSLErrorQueue.message("cannot load \(certificateKey) \(certificateFile)"))
        }
        ERR_clear_error()
        guard SSL_CTX_use_PrivateKey_file(context, keyFile, SSL_FILETYPE_PEM) == 1 else {
            let queue = OpenSSLErrorQueue.drain()
            if queue.contains("key values mismatch") {
                throw .config("\(keyKey) \(keyFile) does not match \(certificateKey) \(certificateFile) (key values mismatch)")
            }
            throw .config("cannot load \(keyKey) \(keyFile): \(queue.isEmpty ? "no private key found" : queue)")
        }
        ERR_clear_error()
        guard SSL_CTX_check_private_key(context) == 1 else {
            throw .config(OpenSSLErrorQueue.message("\(keyKey) \(keyFile) does not match \(certificateKey) \(certificateFile)"))
        }
    }
}

/// One TLS connection over two memory BIOs.
///
/// Owns: the `SSL` (freed in `deinit`, which frees both BIOs attached to it) and a strong
/// reference to its `TLSContext`. Lives on its connection's loop and is not thread-safe.
///
/// States: `handshaking` → `open` (handshake complete) → `closed` (close_notify received), and
/// any of them → `failed` (terminal: every later call throws the same error). `sentShutdown` is
/// orthogonal: set by `shutdown()`, after which writes throw `tls.closed`.
///
/// The shell's contract: feed every byte read from the socket, call `feedEOF()` on EOF, and after
/// every other call, including one that threw (a failing handshake queues an alert), write what
/// `drainCiphertext` returns.
public final class TLSEngine {
    public enum HandshakeState: Equatable { case complete, inProgress }
    public enum ReadResult: Equatable { case bytes(Int), wantMore, closed }

    private enum State {
        case handshaking
        case open
        case closed
        case failed(TLSError)
    }

    private enum Phase { case handshake, read, write }

    private enum Outcome {
        case wantIO
        case closed
        case failed(TLSError)
    }

    public let context: TLSContext
    private let ssl: OpaquePointer
    /// Ciphertext from the network; owned by `ssl`.
    private let networkToEngine: OpaquePointer
    /// Ciphertext for the network; owned by `ssl`.
    private let engineToNetwork: OpaquePointer
    /// The name the client verifies (for messages); nil on a server.
    public let serverName: String?
    /// The client's key in its context's session cache (`host:port`); nil on a server.
    let sessionKey: String?
    /// A kept session was offered to the server.
    private var offeredSession = false
    /// The handshake resumed a session (known once it completed).
    public private(set) var resumedSession = false
    private var state: State = .handshaking
    private var eofReceived = false
    private var sentShutdown = false
    /// Plaintext accepted before the handshake completed; written when it does.
    private var pendingPlaintext: [UInt8] = []

    /// A client engine for `serverName`: a DNS name (sent as SNI, RFC 6066 §3, and checked against
    /// the certificate's DNS SANs, no partial wildcards) or an IP literal (`127.0.0.1`, `::1`,
    /// `[::1]`; no SNI, checked against the IP SANs).
    ///
    /// `port`: with it, a session kept from an earlier connection to the same `serverName:port`
    /// through the same context is offered (resumption), and new sessions are kept for the next.
    public init(client context: TLSContext, serverName: String, port: UInt16? = nil) throws(TLSError) {
        guard context.role == .client else { throw .config("a client engine needs a client context") }
        var name = serverName
        if name.hasPrefix("["), name.hasSuffix("]") { name = String(name.dropFirst().dropLast()) }
        // An absolute DNS name ("example.com.") is verified and sent as SNI without its final dot
        // (RFC 6066 §3: the SNI host name has no trailing dot; certificates name hosts without it).
        if name.hasSuffix(".") { name.removeLast() }
        guard !name.isEmpty else { throw .config("empty server name: the host name cannot be verified") }
        (ssl, networkToEngine, engineToNetwork) = try Self.makeSSL(context)
        self.context = context
        self.serverName = name
        sessionKey = port.map { "\(name):\($0)" }
        SSL_set_connect_state(ssl)
        if let sessionKey, let cache = context.sessionCache {
            // The callback finds this engine through the app-data slot; the engine owns `ssl`,
            // so the pointer is valid whenever OpenSSL calls back on it.
            _ = bearerd_SSL_set_app_data(ssl, Unmanaged.passUnretained(self).toOpaque())
            offeredSession = cache.offer(to: ssl, key: sessionKey)
        }
        let param = SSL_get0_param(ssl)
        ERR_clear_error()
        if Self.isIPLiteral(name) {
            guard X509_VERIFY_PARAM_set1_ip_asc(param, name) == 1 else {
                throw .config(OpenSSLErrorQueue.message("cannot verify IP address \(name)"))
            }
        } else {
            X509_VERIFY_PARAM_set_hostflags(param, UInt32(X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS))
            guard X509_VERIFY_PARAM_set1_host(param, name, 0) == 1 else {
                throw .config(OpenSSLErrorQueue.message("cannot verify host name \(name)"))
            }
            guard bearerd_SSL_set_tlsext_host_name(ssl, name) == 1 else {
                throw .config(OpenSSLErrorQueue.message("cannot send SNI \(name)"))
            }
        }
    }

    /// A server engine.
    public init(server context: TLSContext) throws(TLSError) {
        guard context.role == .server else { throw .config("a server engine needs a server context") }
        (ssl, networkToEngine, engineToNetwork) = try Self.makeSSL(context)
        self.context = context
        self.serverName = nil
        sessionKey = nil
        SSL_set_accept_state(ssl)
    }

    deinit {
        SSL_free(ssl)  // frees both BIOs
    }

    private static func makeSSL(_ context: TLSContext) throws(TLSError) -> (OpaquePointer, OpaquePointer, OpaquePointer) {
        ERR_clear_error()
        guard let ssl = SSL_new(context.context) else {
            throw .config(OpenSSLErrorQueue.message("SSL_new failed"))
        }
        guard let input = BIO_new(BIO_s_mem()) else {
            SSL_free(ssl)
            throw .config(OpenSSLErrorQueue.message("BIO_new failed"))
        }
        guard let output = BIO_new(BIO_s_mem()) else {
            BIO_free(input)
            SSL_free(ssl)
            throw .config(OpenSSLErrorQueue.message("BIO_new failed"))
        }
        // An empty memory BIO reads as "retry later", not EOF, until `feedEOF`.
        _ = bearerd_BIO_set_mem_eof_return(input, -1)
        _ = bearerd_BIO_set_mem_eof_return(output, -1)
        SSL_set_bio(ssl, input, output)  // ssl owns both BIOs from here
        return (ssl, input, output)
    }

    private static func isIPLiteral(_ name: String) -> Bool {
        var v4 = in_addr()
        var v6 = in6_addr()
        return inet_pton(AF_INET, name, &v4) == 1 || inet_pton(AF_INET6, name, &v6) == 1
    }

    // MARK: Input

    /// Appends bytes read from the socket to the engine's input.
    public func feedCiphertext(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        var written = 0
        // A memory BIO grows as needed: the write takes everything or fails only on allocation failure.
        let rc = BIO_write_ex(networkToEngine, base, bytes.count, &written)
        precondition(rc == 1 && written == bytes.count, "memory BIO refused \(bytes.count) bytes")  // allocation failure only
    }

    /// The socket reached EOF: once the fed bytes are consumed, reads see the end of the stream.
    public func feedEOF() {
        eofReceived = true
        _ = bearerd_BIO_set_mem_eof_return(networkToEngine, 0)
    }

    // MARK: Driving

    /// Drives the handshake with what was fed so far. `.inProgress`: drain, then feed more and call
    /// again. Once `.complete`, it stays so (also after close_notify).
    public func handshake() throws(TLSError) -> HandshakeState {
        switch state {
        case .failed(let error): throw error
        case .open, .closed: return .complete
        case .handshaking: break
        }
        ERR_clear_error()
        let rc = SSL_do_handshake(ssl)
        if rc == 1 {
            state = .open
            noteHandshake()
            try flushPendingPlaintext()
            return .complete
        }
        switch classify(rc, during: .handshake) {
        case .wantIO:
            return .inProgress
        case .closed:
            throw fail(TLSError(reason: "tls.handshake_failed", message: "peer sent close_notify during the handshake"))
        case .failed(let error):
            throw fail(error)
        }
    }

    /// Decrypts into `buffer` (which must not be empty). `.wantMore`: feed more ciphertext (and
    /// drain: reading may produce output, e.g. a TLS 1.3 KeyUpdate answer). `.closed`: the peer
    /// sent close_notify. EOF without close_notify throws `tls.protocol` ("unexpected eof").
    /// Called before the handshake completed, it drives the handshake first.
    public func readPlaintext(into buffer: UnsafeMutableRawBufferPointer) throws(TLSError) -> ReadResult {
        switch state {
        case .failed(let error): throw error
        case .closed: return .closed
        case .handshaking:
            if try handshake() == .inProgress { return .wantMore }
        case .open:
            try flushPendingPlaintext()
        }
        guard let base = buffer.baseAddress, buffer.count > 0 else {
            preconditionFailure("readPlaintext needs a non-empty buffer")  // caller bug: a zero read is indistinguishable from no data
        }
        var count = 0
        ERR_clear_error()
        let rc = SSL_read_ex(ssl, base, buffer.count, &count)
        if rc == 1 { return .bytes(count) }
        switch classify(rc, during: .read) {
        case .wantIO:
            return .wantMore
        case .closed:
            state = .closed
            return .closed
        case .failed(let error):
            throw fail(error)
        }
    }

    /// Encrypts all of `bytes` (the output BIO grows as needed, so nothing is left over); drain
    /// afterwards. Before the handshake completed the bytes are kept and encrypted as soon as it
    /// does (TLS 1.3 early data is never used). Throws `tls.closed` after `shutdown()` or after
    /// the peer's close_notify.
    public func writePlaintext(_ bytes: UnsafeRawBufferPointer) throws(TLSError) {
        switch state {
        case .failed(let error): throw error
        case .closed: throw TLSError(reason: "tls.closed", message: "the peer closed the TLS stream")
        case .handshaking, .open: break
        }
        if sentShutdown { throw TLSError(reason: "tls.closed", message: "write after shutdown") }
        guard bytes.count > 0 else { return }
        if case .handshaking = state {
            pendingPlaintext.append(contentsOf: bytes)
            return
        }
        if !pendingPlaintext.isEmpty {
            pendingPlaintext.append(contentsOf: bytes)  // keep the order
            try flushPendingPlaintext()
        } else {
            try write(bytes)
        }
    }

    /// Writes what was accepted before the handshake completed (or left over by a write that
    /// wanted I/O).
    private func flushPendingPlaintext() throws(TLSError) {
        guard !pendingPlaintext.isEmpty else { return }
        let pending = pendingPlaintext
        pendingPlaintext = []
        // withUnsafeBytes rethrows untyped errors: carry the typed one out in a Result.
        let result = pending.withUnsafeBytes { raw in Result { () throws(TLSError) in try write(raw) } }
        try result.get()
    }

    /// Writes `bytes`; what OpenSSL cannot take because it wants I/O first (rare: only during a
    /// TLS 1.2 renegotiation) is kept in `pendingPlaintext` for the next write or read.
    private func write(_ bytes: UnsafeRawBufferPointer) throws(TLSError) {
        var offset = 0
        while offset < bytes.count {
            var written = 0
            ERR_clear_error()
            let rc = SSL_write_ex(ssl, bytes.baseAddress! + offset, bytes.count - offset, &written)  // non-empty: checked by the loop condition
            if rc == 1 {
                offset += written
                continue
            }
            switch classify(rc, during: .write) {
            case .wantIO:
                pendingPlaintext.append(contentsOf: bytes[offset...])
                return
            case .closed:
                throw fail(TLSError(reason: "tls.closed", message: "the peer closed the TLS stream"))
            case .failed(let error):
                throw fail(error)
            }
        }
    }

    /// Queues close_notify (RFC 8446 §6.1); drain afterwards. Idempotent. Before the handshake
    /// completed nothing is sent (the shell just closes the socket).
    public func shutdown() {
        guard !sentShutdown else { return }
        sentShutdown = true
        switch state {
        case .open, .closed:
            ERR_clear_error()
            _ = SSL_shutdown(ssl)  // 0: sent, peer's not yet received; both fine for a memory BIO
            ERR_clear_error()
        case .handshaking, .failed:
            break
        }
    }

    // MARK: Output

    /// APPENDS the pending output ciphertext to `buffer`.
    public func drainCiphertext(into buffer: inout [UInt8]) {
        while true {
            let pending = Int(BIO_ctrl_pending(engineToNetwork))
            guard pending > 0 else { return }
            let start = buffer.count
            buffer.append(contentsOf: repeatElement(0, count: pending))
            var read = 0
            let rc = buffer.withUnsafeMutableBytes { BIO_read_ex(engineToNetwork, $0.baseAddress! + start, pending, &read) }  // non-empty: pending > 0
            if rc != 1 { read = 0 }
            buffer.removeLast(pending - read)
            if read == 0 { return }
        }
    }

    public var hasPendingCiphertext: Bool { BIO_ctrl_pending(engineToNetwork) > 0 }

    // MARK: Facts

    public var isHandshakeComplete: Bool {
        switch state {
        case .open, .closed: return true
        case .handshaking, .failed: return false
        }
    }

    /// The ALPN protocol both sides agreed on (RFC 7301), nil when none.
    public var negotiatedALPN: String? {
        var data: UnsafePointer<UInt8>?
        var length: UInt32 = 0
        SSL_get0_alpn_selected(ssl, &data, &length)
        guard let data, length > 0 else { return nil }
        return String(decoding: UnsafeBufferPointer(start: data, count: Int(length)), as: UTF8.self)
    }

    /// "TLSv1.3", "TLSv1.2" once the handshake completed.
    public var negotiatedProtocolVersion: String? {
        guard isHandshakeComplete, let version = SSL_get_version(ssl) else { return nil }
        return String(cString: version)
    }

    /// The peer certificate's subject in RFC 2253 form ("CN=bearerd-test-client"); nil when the
    /// peer sent none. On a server: the client certificate.
    public var peerCertificateSubject: String? {
        guard let certificate = SSL_get0_peer_certificate(ssl), let name = X509_get_subject_name(certificate) else { return nil }
        guard let bio = BIO_new(BIO_s_mem()) else { return nil }
        defer { BIO_free(bio) }
        guard X509_NAME_print_ex(bio, name, 0, bearerd_XN_FLAG_RFC2253()) >= 0 else { return nil }
        let length = Int(BIO_ctrl_pending(bio))
        var bytes = [UInt8](repeating: 0, count: length)
        var read = 0
        guard length == 0 || BIO_read_ex(bio, &bytes, length, &read) == 1 else { return nil }
        return String(decoding: bytes.prefix(read), as: UTF8.self)
    }

    // MARK: Errors

    /// Records a completed client handshake; a kept session the server declined is dropped.
    private func noteHandshake() {
        guard let sessionKey else { return }
        resumedSession = SSL_session_reused(ssl) == 1
        if offeredSession && !resumedSession { context.sessionCache?.drop(key: sessionKey) }
        TLSHandshakeStats.record(peer: sessionKey, resumed: resumedSession)
    }

    @discardableResult
    private func fail(_ error: TLSError) -> TLSError {
        if case .handshaking = state, offeredSession, let sessionKey {
            // A handshake that failed after offering a session: start afresh next time.
            context.sessionCache?.drop(key: sessionKey)
        }
        state = .failed(error)
        pendingPlaintext = []
        return error
    }

    /// THE place that interprets a failed SSL call's return code. Call right after the call, with
    /// the error queue as the call left it; it empties the queue.
    private func classify(_ rc: Int32, during phase: Phase) -> Outcome {
        let code = SSL_get_error(ssl, rc)
        switch code {
        case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE:
            return .wantIO
        case SSL_ERROR_ZERO_RETURN:
            return .closed
        default:
            let queue = OpenSSLErrorQueue.drain()
            let verifyResult = SSL_get_verify_result(ssl)
            if verifyResult != Int(X509_V_OK) {
                let why = String(cString: X509_verify_cert_error_string(verifyResult))
                let whose = serverName.map { "the certificate of \($0)" } ?? "the client certificate"
                return .failed(TLSError(reason: "tls.verify_failed", message: "\(whose) failed verification: \(why)"))
            }
            let reason = phase == .handshake ? "tls.handshake_failed" : "tls.protocol"
            if eofReceived, queue.isEmpty || queue.contains("unexpected eof") {
                let what = phase == .handshake ? "connection closed during the handshake" : "unexpected eof: the stream ended without close_notify"
                return .failed(TLSError(reason: reason, message: what))
            }
            let detail = queue.isEmpty ? "SSL_get_error \(code)" : queue
            return .failed(TLSError(reason: reason, message: detail))
        }
    }
}
