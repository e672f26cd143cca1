import BearerdOAuth
import BearerdTLS
import BearerdConfig
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The clock skew a session observed from its token endpoint's `Date` header (docs/architecture.md §6 "Clock
/// skew"): `local - server` in seconds, kept only when it exceeds 5 s, so the assertions and
/// proofs bearerd signs take their `iat` from the server's idea of now.
///
/// Owns two atomics; any thread. Written by the session queue when a token response arrives,
/// read by whoever signs (session queue, loops).
public final class ClockSkew: Sendable {
    /// Differences up to this many seconds are ignored (ordinary drift, one-second `Date` granularity).
    public static let threshold: Int64 = 5
    private let skew = Atomic<Int64>(0)
    private let measured = Atomic<Int64>(0)
    private let warned = Atomic<Bool>(false)

    public init() {}

    /// The last skew measured, whether or not it is applied.
    public var lastMeasured: Int64 { measured.load(ordering: .relaxed) }

    /// The skew in effect (0 when within the threshold).
    public var seconds: Int64 { skew.load(ordering: .relaxed) }

    /// `iat` for something signed now: the local clock minus the skew.
    public func issuedAt(localNow: Int64) -> Int64 { localNow.subtractingSaturating(seconds) }

    /// Records the skew a response's `Date` implies. Returns the measured skew when it is the
    /// first time it exceeds the threshold (the caller logs it once, at warning level).
    public func observe(dateHeader: String?, localNow: Int64) -> Int64? {
        guard let dateHeader, let server = HTTPDate.parse(dateHeader) else { return nil }
        let measured = localNow.subtractingSaturating(server)
        self.measured.store(measured, ordering: .relaxed)
        let magnitude = measured == .min ? Int64.max : abs(measured)
        guard magnitude > Self.threshold else {
            skew.store(0, ordering: .relaxed)
            return nil
        }
        skew.store(measured, ordering: .relaxed)
        return warned.exchange(true, ordering: .relaxed) ? nil : measured
    }
}

extension Int64 {
    func subtractingSaturating(_ other: Int64) -> Int64 {
        let (r, o) = subtractingReportingOverflow(other)
        return o ? (other < 0 ? .max : .min) : r
    }
}

/// RFC 9110 §5.6.7 IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the only form servers send
/// today; anything else is ignored. Pure arithmetic (days from civil), no time zone database.
enum HTTPDate {
    static func parse(_ text: String) -> Int64? {
        let parts = text.split(separator: " ")
        guard parts.count == 6, parts[5] == "GMT", let day = Int64(parts[1]), (1...31).contains(day), let year = Int64(parts[3]),
              (1970...9999).contains(year) else { return nil }
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        guard let m = months.firstIndex(of: String(parts[2])) else { return nil }
        let hms = parts[4].split(separator: ":")
        guard hms.count == 3, let h = Int64(hms[0]), let mi = Int64(hms[1]), let s = Int64(hms[2]),
              (0...23).contains(h), (0...59).contains(mi), (0...60).contains(s) else { return nil }
        let days = CivilTime.daysFromCivil(year: year, month: Int64(m + 1), day: day)
        return days * 86_400 + h * 3600 + mi * 60 + s
    }
}

/// One DPoP session's key and the state its proofs need (RFC 9449; docs/architecture.md §6.11): the
/// signer, its public JWK and thumbprint (`jkt`), the server nonces last seen per token endpoint
/// and per upstream origin, the session's clock skew, and the nonce-retry counters.
///
/// Immutable after init except `nonces` (under a `Mutex`, held only for one dictionary access:
/// loops read it without waiting on I/O) and the counters (atomics). Any thread. Invariants: the
/// private key never leaves the signer; proofs and keys are never logged (only `thumbprint`).
public final class DPoPProofer: Sendable {
    let signer: JWTSigner
    public var algorithm: String { signer.algorithm }
    /// The public key as JSON text (RFC 7638 members only), as it goes in each proof's `jwk`.
    public let publicJWK: String
    /// RFC 7638 thumbprint of the key: the `jkt` tokens are bound to (RFC 9449 §6).
    public let thumbprint: String
    /// Where the key came from (a path), for messages.
    public let keyPath: String
    let clockSkew: ClockSkew
    private let nonces = Mutex<[String: String]>([:])
    private let tokenNonceRetries = Atomic<UInt64>(0)
    private let upstreamNonceRetries = Atomic<UInt64>(0)
    /// At most this many remembered nonces (origins come from the configuration; a bound anyway).
    static let maxNonces = 256

    init(signer: JWTSigner, keyPath: String, clockSkew: ClockSkew) {
        self.signer = signer
        self.keyPath = keyPath
        self.clockSkew = clockSkew
        publicJWK = signer.jwk.canonicalJSON
        thumbprint = signer.jwk.thumbprint
    }

    /// A fresh proof (new `jti`) for one request. `url` is the absolute target (query and
    /// fragment are dropped for `htu`); `accessToken` adds `ath` (resource requests); `nonce` the
    /// server's last `DPoP-Nonce`. Nil only when signing fails (the caller then fails the request).
    public func proof(method: String, url: String, accessToken: String?, nonce: String?) -> String? {
        var g = SystemRandomNumberGenerator()
        var raw = [UInt8](repeating: 0, count: 16)
        for i in raw.indices { raw[i] = UInt8.random(in: 0...255, using: &g) }
        let input = DPoP.signingInput(algorithm: signer.algorithm, publicJWK: publicJWK, jti: Base64.encodeURL(raw), method: method,
                                      uri: url, issuedAt: clockSkew.issuedAt(localNow: wallClockSeconds()),
                                      accessToken: accessToken, nonce: nonce)
        guard let signature = try? signer.sign(Array(input.utf8)) else { return nil }
        return DPoP.assemble(signingInput: input, signature: signature)
    }

    /// `encoded` with a fresh proof for a token request to `url` (RFC 9449 §5), carrying the
    /// endpoint's last nonce. Nil only when signing fails.
    public func signedTokenRequest(_ encoded: EncodedTokenRequest, url: String) -> EncodedTokenRequest? {
        guard let proof = proof(method: "POST", url: url, accessToken: nil, nonce: nonce(for: Self.tokenEndpointKey(url))) else {
            return nil
        }
        return EncodedTokenRequest(body: encoded.body, headers: encoded.headers + [(DPoP.proofHeader, proof)])
    }

    /// Remembers a token endpoint answer's `DPoP-Nonce`; true when the answer is RFC 9449 §8's
    /// demand (`400 use_dpop_nonce` with a usable nonce): the request is then sent once more at once.
    public func tokenEndpointAsksForNonce(url: String, status: Int, headers: [(name: String, value: String)], body: [UInt8]) -> Bool {
        guard let value = headers.first(where: { $0.name.lowercased() == "dpop-nonce" })?.value,
              noteNonce(value, for: Self.tokenEndpointKey(url)) else { return false }
        return status == 400 && TokenEndpointFailure.oauthErrorCode(body) == "use_dpop_nonce"
    }

    /// Nonce keys: a token endpoint by its URL, an upstream by its origin.
    public static func tokenEndpointKey(_ url: String) -> String { "token " + url }
    public static func originKey(scheme: String, authority: String) -> String { "origin " + scheme + "://" + authority }

    /// The last nonce the server behind `key` sent, if any.
    public func nonce(for key: String) -> String? {
        nonces.withLock { $0[key] }
    }

    /// Remembers a `DPoP-Nonce` value (ignored unless RFC 9449 §8.1's syntax). Returns true when
    /// it was accepted.
    @discardableResult
    public func noteNonce(_ value: String, for key: String) -> Bool {
        guard let v = DPoP.acceptableNonce(value) else { return false }
        nonces.withLock { n in
            if n[key] == v { return }
            if n[key] == nil, n.count >= Self.maxNonces { n.removeAll(keepingCapacity: true) }
            n[key] = v
        }
        return true
    }

    public enum Side: String, Sendable { case tokenEndpoint = "token_endpoint", upstream }

    public func countNonceRetry(_ side: Side) {
        switch side {
        case .tokenEndpoint: tokenNonceRetries.add(1, ordering: .relaxed)
        case .upstream: upstreamNonceRetries.add(1, ordering: .relaxed)
        }
    }

    public func nonceRetries(_ side: Side) -> UInt64 {
        switch side {
        case .tokenEndpoint: tokenNonceRetries.load(ordering: .relaxed)
        case .upstream: upstreamNonceRetries.load(ordering: .relaxed)
        }
    }

    // MARK: the key

    /// Where a session keeps its generated key: `<state_dir>/<session>.dpop.pem`.
    public static func generatedKeyPath(stateDir: String, session: String) -> String {
        (stateDir.hasSuffix("/") ? String(stateDir.dropLast()) : stateDir) + "/" + session + ".dpop.pem"
    }

    public enum KeyProblem: Error, Sendable, CustomStringConvertible {
        /// The key file cannot be read or holds no usable key (type, size).
        case unusable(key: String, message: String)
        case store(String)
        public var description: String {
            switch self {
            case .unusable(_, let m): m
            case .store(let m): m
            }
        }
    }

    /// The session's DPoP key: `dpop_key_file`, else the key generated once in `state_dir` (made
    /// now if absent, under `<session>.dpop.lock`: see `generateIfMissing`). Blocking file I/O:
    /// call off the loops.
    static func load(_ session: SessionConfig, stateDir: String?, clockSkew: ClockSkew) throws(KeyProblem) -> DPoPProofer {
        if let file = session.dpopKeyFile {
            do throws(TLSError) {
                return DPoPProofer(signer: try JWTSigner(pemFile: file), keyPath: file, clockSkew: clockSkew)
            } catch {
                throw .unusable(key: "dpop_key_file", message: error.message)
            }
        }
        guard let stateDir else { throw .store("dpop: true without dpop_key_file needs state_dir to keep the generated key") }
        let path = generatedKeyPath(stateDir: stateDir, session: session.name)
        if access(path, F_OK) != 0 {
            try generateIfMissing(at: path, stateDir: stateDir, session: session.name)
        }
        do throws(TLSError) {
            return DPoPProofer(signer: try JWTSigner(pemFile: path), keyPath: path, clockSkew: clockSkew)
        } catch {
            throw .unusable(key: "state_dir", message: "the generated DPoP key: " + error.message)
        }
    }

    /// Makes the key at `path` unless it exists, holding the `flock` of
    /// `<state_dir>/<session>.dpop.lock` (its own lock: `bearerd token` may hold the session's
    /// `.lock` meanwhile), so processes starting at once (`bearerd run`, concurrent `bearerd
    /// token`s, replicas on a shared `state_dir`) end up with one key: whoever comes second finds
    /// it. The key goes to a new temp file (random name, `O_EXCL|O_NOFOLLOW`, 0600 by `fchmod`),
    /// is fsynced, then linked into place (`link` never replaces nor follows a symlink).
    static func generateIfMissing(at path: String, stateDir: String, session: String) throws(KeyProblem) {
        let lockFD: Int32
        do throws(StateStoreError) {
            try StateStore.ensureDirectory(stateDir)
            lockFD = try StateStore.takeLock((stateDir.hasSuffix("/") ? String(stateDir.dropLast()) : stateDir) + "/" + session + ".dpop.lock")
        } catch {
            throw .store(error.description)
        }
        defer { close(lockFD) }  // releases the flock
        var st = stat()
        if lstat(path, &st) == 0 { return }  // made by whoever held the lock before us
        let pem: [UInt8]
        do throws(TLSError) {
            pem = try JWTSigner.generateP256PrivateKeyPEM()
        } catch {
            throw .store(error.message)
        }
        let temp = StateStore.tempPath(for: path)
        do throws(StateStoreError) {
            try StateStore.writeSynced(pem, toNewFile: temp)
        } catch {
            throw .store(error.description)
        }
        defer { unlink(temp) }
        // Under the lock nobody else makes it; link(2) still never replaces what is there.
        if link(temp, path) != 0, errno != EEXIST {
            throw .store(StateStoreError(reason: "state.rename", path: path, errno: errno).description)
        }
        do throws(StateStoreError) {
            try StateStore.syncDirectory(stateDir)
        } catch {
            throw .store(error.description)
        }
    }
}

/// What `bearerd check` tells about a DPoP session's key: its `jkt` (RFC 7638 thumbprint) and
/// algorithm, or that it will be generated in `state_dir` on first start.
public enum DPoPKeyDescription: Sendable {
    case key(path: String, algorithm: String, thumbprint: String)
    case toBeGenerated(path: String)

    /// Nil for sessions without `dpop: true`. Never creates a key.
    public static func of(_ session: SessionConfig, stateDir: String?) -> Result<DPoPKeyDescription, DPoPProofer.KeyProblem>? {
        guard session.dpop else { return nil }
        let path: String
        if let file = session.dpopKeyFile {
            path = file
        } else {
            guard let stateDir else { return .failure(.store("dpop: true without dpop_key_file needs state_dir")) }
            path = DPoPProofer.generatedKeyPath(stateDir: stateDir, session: session.name)
            if access(path, F_OK) != 0 { return .success(.toBeGenerated(path: path)) }
        }
        do throws(TLSError) {
            let signer = try JWTSigner(pemFile: path)
            return .success(.key(path: path, algorithm: signer.algorithm, thumbprint: signer.jwk.thumbprint))
        } catch {
            return .failure(.unusable(key: session.dpopKeyFile == nil ? "state_dir" : "dpop_key_file", message: error.message))
        }
    }
}
