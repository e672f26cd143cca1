// Throwaway certificates for tests, made with the OpenSSL C API (no `openssl` command needed).

import BearerdIO
import COpenSSL
import Foundation
import BearerdTLS

/// A failure while making or writing test certificates; `message` carries OpenSSL's error queue.
public struct TestPKIError: Error, CustomStringConvertible {
    public var message: String
    public var description: String { "test PKI: \(message)" }
}

/// A throwaway PKI in a fresh temporary directory: one CA (EC P-256, self-signed), a server
/// certificate signed by it (SANs from `serverNames`: DNS names and IP literals), and a client
/// certificate (CN=bearerd-test-client, extendedKeyUsage clientAuth). Every file is PEM; keys are
/// written with mode 0600. Only paths are stored (the value is `Sendable`); more certificates from
/// the same CA are issued by reading `caFile` / `caKeyFile` back.
///
/// Typical use:
/// ```swift
/// let pki = try TestPKI.generate()
/// defer { pki.remove() }
/// let server = try pki.serverContext(alpn: ["h2", "http/1.1"])
/// let client = try TLSContext.client(caFile: pki.caFile, clientCert: nil, clientKey: nil, alpn: ["h2"])
/// ```
public struct TestPKI: Sendable {
    public let directory: String
    public let caFile: String
    public let caKeyFile: String
    public let serverCertFile: String
    public let serverKeyFile: String
    public let clientCertFile: String
    public let clientKeyFile: String
    public let serverNames: [String]

    public static let clientCommonName = "bearerd-test-client"

    /// Makes the CA, the server certificate for `serverNames` and the client certificate.
    public static func generate(serverNames: [String] = ["localhost", "127.0.0.1"]) throws -> TestPKI {
        precondition(!serverNames.isEmpty, "a server certificate needs at least one name")  // caller bug
        let directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("bearerd-pki-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])

        let caKey = try Key.generate()
        let ca = try Certificate.make(
            commonName: "bearerd test CA", publicKey: caKey, issuer: nil, signingKey: caKey,
            extensions: [
                (NID_basic_constraints, "critical,CA:TRUE"),
                (NID_key_usage, "critical,keyCertSign,cRLSign"),
                (NID_subject_key_identifier, "hash"),
            ])
        let caFile = directory + "/ca.pem"
        let caKeyFile = directory + "/ca-key.pem"
        try ca.write(to: caFile)
        try caKey.write(to: caKeyFile)

        let pki = TestPKI(
            directory: directory, caFile: caFile, caKeyFile: caKeyFile,
            serverCertFile: directory + "/server.pem", serverKeyFile: directory + "/server-key.pem",
            clientCertFile: directory + "/client.pem", clientKeyFile: directory + "/client-key.pem",
            serverNames: serverNames)
        try pki.issue(ca: ca, caKey: caKey, leaf: .server(names: serverNames), certFile: pki.serverCertFile, keyFile: pki.serverKeyFile)
        try pki.issue(ca: ca, caKey: caKey, leaf: .client(commonName: clientCommonName), certFile: pki.clientCertFile, keyFile: pki.clientKeyFile)
        return pki
    }

    /// Issues another server certificate from this CA (e.g. for a name the client does not ask
    /// for), written as `<label>.pem` and `<label>-key.pem` in `directory`.
    public func issueServerCertificate(names: [String], label: String) throws -> (certFile: String, keyFile: String) {
        let (ca, caKey) = try loadAuthority()
        let files = (certFile: directory + "/\(label).pem", keyFile: directory + "/\(label)-key.pem")
        try issue(ca: ca, caKey: caKey, leaf: .server(names: names), certFile: files.certFile, keyFile: files.keyFile)
        return files
    }

    /// Issues another client certificate from this CA.
    public func issueClientCertificate(commonName: String, label: String) throws -> (certFile: String, keyFile: String) {
        let (ca, caKey) = try loadAuthority()
        let files = (certFile: directory + "/\(label).pem", keyFile: directory + "/\(label)-key.pem")
        try issue(ca: ca, caKey: caKey, leaf: .client(commonName: commonName), certFile: files.certFile, keyFile: files.keyFile)
        return files
    }

    /// A server context presenting the server certificate; when `requireClientCertificate`, the
    /// client must present one signed by this CA.
    public func serverContext(alpn: [String] = [], requireClientCertificate: Bool = false) throws(TLSError) -> TLSContext {
        try TLSContext.server(
            certificateChainFile: serverCertFile, privateKeyFile: serverKeyFile,
            clientCAFile: requireClientCertificate ? caFile : nil,
            requireClientCertificate: requireClientCertificate, alpn: alpn)
    }

    /// A client context trusting this CA, presenting the client certificate when asked to.
    public func clientContext(alpn: [String] = [], presentClientCertificate: Bool = false) throws(TLSError) -> TLSContext {
        try TLSContext.client(
            caFile: caFile,
            clientCert: presentClientCertificate ? clientCertFile : nil,
            clientKey: presentClientCertificate ? clientKeyFile : nil, alpn: alpn)
    }

    /// Deletes the directory and everything in it.
    public func remove() {
        try? FileManager.default.removeItem(atPath: directory)
    }

    // MARK: Issuing

    private enum Leaf {
        case server(names: [String])
        case client(commonName: String)
    }

    private func issue(ca: Certificate, caKey: Key, leaf: Leaf, certFile: String, keyFile: String) throws {
        let key = try Key.generate()
        var extensions: [(Int32, String)] = [
            (NID_basic_constraints, "critical,CA:FALSE"),
            (NID_key_usage, "critical,digitalSignature"),
            (NID_subject_key_identifier, "hash"),
            (NID_authority_key_identifier, "keyid:always"),
        ]
        let commonName: String
        switch leaf {
        case .server(let names):
            commonName = names.first ?? "server"
            extensions.append((NID_ext_key_usage, "serverAuth"))
            let alternatives = names.map { Self.isIPLiteral($0) ? "IP:\($0)" : "DNS:\($0)" }
            extensions.append((NID_subject_alt_name, alternatives.joined(separator: ",")))
        case .client(let name):
            commonName = name
            extensions.append((NID_ext_key_usage, "clientAuth"))
        }
        let certificate = try Certificate.make(commonName: commonName, publicKey: key, issuer: ca, signingKey: caKey, extensions: extensions)
        try certificate.write(to: certFile)
        try key.write(to: keyFile)
    }

    private func loadAuthority() throws -> (Certificate, Key) {
        (try Certificate.read(from: caFile), try Key.read(from: caKeyFile))
    }

    private static func isIPLiteral(_ name: String) -> Bool {
        var v4 = in_addr()
        var v6 = in6_addr()
        return inet_pton(AF_INET, name, &v4) == 1 || inet_pton(AF_INET6, name, &v6) == 1
    }
}

// MARK: - OpenSSL objects, each owned by exactly one Swift object

private func openSSLFailure(_ what: String) -> TestPKIError {
    var parts: [String] = []
    while case let code = ERR_get_error(), code != 0 {
        var buffer = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(code, &buffer, buffer.count)
        parts.append(String(cString: buffer))
    }
    return TestPKIError(message: "\(what): \(parts.isEmpty ? "unknown error" : parts.joined(separator: "; "))")
}

/// Writes `contents` with `mode` (keys: 0600).
private func writeFile(_ path: String, _ contents: [UInt8], mode: Int) throws {
    guard FileManager.default.createFile(atPath: path, contents: Data(contents), attributes: [.posixPermissions: mode]) else {
        throw TestPKIError(message: "cannot write \(path)")
    }
}

/// Runs `body` on a fresh memory BIO and returns what it wrote.
private func pem(_ what: String, _ body: (OpaquePointer) -> Int32) throws -> [UInt8] {
    guard let bio = BIO_new(BIO_s_mem()) else { throw openSSLFailure("BIO_new") }
    defer { BIO_free(bio) }
    guard body(bio) == 1 else { throw openSSLFailure(what) }
    let length = Int(BIO_ctrl_pending(bio))
    var bytes = [UInt8](repeating: 0, count: length)
    var read = 0
    guard BIO_read_ex(bio, &bytes, length, &read) == 1, read == length else { throw openSSLFailure(what) }
    return bytes
}

/// Owns one `EVP_PKEY` (freed in deinit).
private final class Key {
    let pointer: OpaquePointer
    init(_ pointer: OpaquePointer) { self.pointer = pointer }
    deinit { EVP_PKEY_free(pointer) }

    /// An EC P-256 key.
    static func generate() throws -> Key {
        ERR_clear_error()
        guard let context = EVP_PKEY_CTX_new_from_name(nil, "EC", nil) else { throw openSSLFailure("EVP_PKEY_CTX_new_from_name") }
        defer { EVP_PKEY_CTX_free(context) }
        guard EVP_PKEY_keygen_init(context) == 1, EVP_PKEY_CTX_set_group_name(context, "P-256") == 1 else {
            throw openSSLFailure("EC key generation setup")
        }
        var key: OpaquePointer?
        guard EVP_PKEY_keygen(context, &key) == 1, let key else { throw openSSLFailure("EVP_PKEY_keygen") }
        return Key(key)
    }

    static func read(from path: String) throws -> Key {
        ERR_clear_error()
        guard let bio = BIO_new_file(path, "r") else { throw openSSLFailure("cannot open \(path)") }
        defer { BIO_free(bio) }
        guard let key = PEM_read_bio_PrivateKey(bio, nil, nil, nil) else { throw openSSLFailure("cannot read a key from \(path)") }
        return Key(key)
    }

    func write(to path: String) throws {
        let bytes = try pem("PEM_write_bio_PrivateKey") { PEM_write_bio_PrivateKey($0, pointer, nil, nil, 0, nil, nil) }
        try writeFile(path, bytes, mode: 0o600)
    }
}

/// Owns one `X509` (freed in deinit).
private final class Certificate {
    let pointer: OpaquePointer
    init(_ pointer: OpaquePointer) { self.pointer = pointer }
    deinit { X509_free(pointer) }

    /// A v3 certificate valid from an hour ago for 30 days; self-signed when `issuer` is nil.
    static func make(commonName: String, publicKey: Key, issuer: Certificate?, signingKey: Key, extensions: [(Int32, String)]) throws -> Certificate {
        ERR_clear_error()
        guard let x509 = X509_new() else { throw openSSLFailure("X509_new") }
        let certificate = Certificate(x509)
        guard X509_set_version(x509, 2) == 1,  // 2 means v3
              ASN1_INTEGER_set(X509_get_serialNumber(x509), Int.random(in: 1..<(1 << 62))  /* random serials: unique per CA in practice */) == 1,
              X509_gmtime_adj(X509_getm_notBefore(x509), -3600) != nil,
              X509_gmtime_adj(X509_getm_notAfter(x509), 30 * 86400) != nil,
              X509_set_pubkey(x509, publicKey.pointer) == 1
        else { throw openSSLFailure("certificate fields") }
        let subject = X509_get_subject_name(x509)
        let name = Array(commonName.utf8)
        guard X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC, name, Int32(name.count), -1, 0) == 1 else {
            throw openSSLFailure("subject name")
        }
        let issuerName = issuer.map { X509_get_subject_name($0.pointer) } ?? subject
        guard X509_set_issuer_name(x509, issuerName) == 1 else { throw openSSLFailure("issuer name") }
        var v3 = X509V3_CTX()
        X509V3_set_ctx(&v3, issuer?.pointer ?? x509, x509, nil, nil, 0)
        for (nid, value) in extensions {
            guard let ext = X509V3_EXT_conf_nid(nil, &v3, nid, value) else { throw openSSLFailure("extension \(value)") }
            defer { X509_EXTENSION_free(ext) }
            guard X509_add_ext(x509, ext, -1) == 1 else { throw openSSLFailure("X509_add_ext \(value)") }
        }
        guard X509_sign(x509, signingKey.pointer, EVP_sha256()) > 0 else { throw openSSLFailure("X509_sign") }
        return certificate
    }

    static func read(from path: String) throws -> Certificate {
        ERR_clear_error()
        guard let bio = BIO_new_file(path, "r") else { throw openSSLFailure("cannot open \(path)") }
        defer { BIO_free(bio) }
        guard let x509 = PEM_read_bio_X509(bio, nil, nil, nil) else { throw openSSLFailure("cannot read a certificate from \(path)") }
        return Certificate(x509)
    }

    func write(to path: String) throws {
        let bytes = try pem("PEM_write_bio_X509") { PEM_write_bio_X509($0, pointer) }
        try writeFile(path, bytes, mode: 0o644)
    }
}
