/// The state file of a refresh_token session (docs/architecture.md §6.7), as bytes.
///
/// Owns the refresh token in use, optionally the access token obtained with it, and where the
/// refresh token came from (`sourceFingerprint`: the fingerprint of the `refresh_token_file`
/// content it descends from, so a newer operator-supplied file can be told apart from our own
/// rotations). Wall-clock times are Unix seconds. The driver writes it (temp file, fsync,
/// rename, fsync dir, mode 0600) under `flock`; this type only encodes and decides.
///
/// Format (JSON object, version 1):
///
///     {"format":1,"refresh_token":"…","access_token":"…","access_token_expires_at":1700000000,
///      "generation":4,"updated_at":1699999000,"source_fingerprint":"1a2b3c4d",
///      "shared_generation":1700000000123}
///
/// `access_token`, `access_token_expires_at` and `generation` are present together or not at
/// all; `source_fingerprint` is optional. `shared_generation` (with `shared_cache:` only) is the
/// generation of the shared-cache record this refresh token belongs to: after a restart, records
/// below it are refused (an old record put back in Redis would carry a refresh token the server
/// has already rotated). Files without it (written before it existed) read as nil. Unknown
/// members are refused (strict).
public struct PersistedSessionState: Sendable, Equatable, CustomStringConvertible {
    public static let formatVersion: Int64 = 1
    /// The largest state file written or read: the token response's own limit (1 MiB, see
    /// `TokenResponseParser.maxBodyBytes`), so whatever a server could send fits, and whatever was
    /// persisted is read back (before, a larger token was written, then refused on read).
    public static let maxFileBytes = 1 << 20
    /// 9999-12-31T23:59:59Z: the largest `updated_at` read back (a larger one is clamped to it).
    public static let latestTimestamp: Int64 = 253_402_300_799

    /// An access token with its wall-clock expiry.
    public struct AccessToken: Sendable, Equatable {
        public var token: OAuthSecret
        public var expiresAt: Int64
        public var generation: UInt64
        public init(token: OAuthSecret, expiresAt: Int64, generation: UInt64) {
            self.token = token
            self.expiresAt = expiresAt
            self.generation = generation
        }
    }

    public var refreshToken: OAuthSecret
    public var accessToken: AccessToken?
    public var updatedAt: Int64
    public var sourceFingerprint: String?
    /// The shared-cache record generation of this refresh token's lineage (nil: none known).
    public var sharedGeneration: UInt64?

    public init(refreshToken: OAuthSecret, accessToken: AccessToken? = nil, updatedAt: Int64, sourceFingerprint: String? = nil,
                sharedGeneration: UInt64? = nil) {
        self.refreshToken = refreshToken
        self.accessToken = accessToken
        self.updatedAt = updatedAt
        self.sourceFingerprint = sourceFingerprint
        self.sharedGeneration = sharedGeneration
    }

    public var description: String {
        "PersistedSessionState(refresh: \(refreshToken.fingerprint), access: \(accessToken.map { "\($0.token.fingerprint)#\($0.generation)" } ?? "none"), updatedAt: \(updatedAt))"
    }

    /// Why a state file was refused. The driver then falls back to the operator file.
    public struct DecodingError: Error, Sendable, Equatable {
        /// `state.malformed_json`, `state.unsupported_format`, `state.missing_field`,
        /// `state.invalid_field`, `state.unknown_field`.
        public let reason: String
        public let field: String?
    }

    public func encode() -> [UInt8] {
        var members: [String] = ["\"format\":\(Self.formatVersion)",
                                 "\"refresh_token\":" + JSONWriter.quote(refreshToken.exposedValue)]
        if let a = accessToken {
            members.append("\"access_token\":" + JSONWriter.quote(a.token.exposedValue))
            members.append("\"access_token_expires_at\":\(a.expiresAt)")
            members.append("\"generation\":\(a.generation)")
        }
        members.append("\"updated_at\":\(updatedAt)")
        if let s = sourceFingerprint { members.append("\"source_fingerprint\":" + JSONWriter.quote(s)) }
        // JSON integers are read back as Int64: a larger generation (only a key holder could seal
        // one) is written clamped, a floor no lower than any real one.
        if let g = sharedGeneration { members.append("\"shared_generation\":\(Int64(clamping: g))") }
        return Array(("{" + members.joined(separator: ",") + "}\n").utf8)
    }

    /// The bytes to persist, never more than `maxFileBytes`: when the access token does not fit
    /// beside the refresh token it is left out (it is optional in the file; a restart then fetches
    /// a new one). Nil when the refresh token alone does not fit: nothing could be read back.
    public func encodeForFile() -> [UInt8]? {
        let full = encode()
        if full.count <= Self.maxFileBytes { return full }
        guard accessToken != nil else { return nil }
        var lean = self
        lean.accessToken = nil
        let bytes = lean.encode()
        return bytes.count <= Self.maxFileBytes ? bytes : nil
    }

    static let knownFields: Set<String> = ["format", "refresh_token", "access_token", "access_token_expires_at",
                                           "generation", "updated_at", "source_fingerprint", "shared_generation"]

    public static func decode(_ bytes: [UInt8]) throws(DecodingError) -> PersistedSessionState {
        guard let value = try? JSONParser(maxDepth: 4, maxBytes: maxFileBytes).parse(bytes), let o = value.objectValue else {
            throw DecodingError(reason: "state.malformed_json", field: nil)
        }
        for key in o.keys where !knownFields.contains(key) { throw DecodingError(reason: "state.unknown_field", field: key) }
        guard let format = o["format"] else { throw DecodingError(reason: "state.missing_field", field: "format") }
        guard format.int64Value == formatVersion else { throw DecodingError(reason: "state.unsupported_format", field: "format") }
        func string(_ k: String) throws(DecodingError) -> String? {
            guard let v = o[k] else { return nil }
            guard let s = v.stringValue, !s.isEmpty else { throw DecodingError(reason: "state.invalid_field", field: k) }
            return s
        }
        func int(_ k: String) throws(DecodingError) -> Int64? {
            guard let v = o[k] else { return nil }
            guard let i = v.int64Value else { throw DecodingError(reason: "state.invalid_field", field: k) }
            return i
        }
        guard let refresh = try string("refresh_token") else { throw DecodingError(reason: "state.missing_field", field: "refresh_token") }
        guard let updatedAt = try int("updated_at") else { throw DecodingError(reason: "state.missing_field", field: "updated_at") }
        let access = try string("access_token"), expires = try int("access_token_expires_at"), generation = try int("generation")
        var accessToken: AccessToken? = nil
        switch (access, expires, generation) {
        case (nil, nil, nil):
            break
        case (let a?, let e?, let g?) where g >= 0:
            accessToken = AccessToken(token: OAuthSecret(a), expiresAt: e, generation: UInt64(g))
        default:
            throw DecodingError(reason: "state.invalid_field", field: "access_token")
        }
        var sharedGeneration: UInt64?
        if let g = try int("shared_generation") {
            guard g >= 0 else { throw DecodingError(reason: "state.invalid_field", field: "shared_generation") }
            sharedGeneration = UInt64(g)
        }
        // Clamped into 0...9999-12-31: the driver stamps the next write `updatedAt + 1`, which
        // must not overflow whatever the file said.
        return PersistedSessionState(refreshToken: OAuthSecret(refresh), accessToken: accessToken,
                                     updatedAt: min(max(updatedAt, 0), Self.latestTimestamp),
                                     sourceFingerprint: try string("source_fingerprint"), sharedGeneration: sharedGeneration)
    }

    /// The stored access token as a grant the state machine can take (`fetchSucceeded` with
    /// `sentAt: now`), if at least `minimumRemaining` of it is left.
    public func adoptableGrant(wallClockNow: Int64, minimumRemaining: Duration = .seconds(60)) -> TokenGrant? {
        guard let a = accessToken else { return nil }
        // Saturating: the file is read from disk and the clock is the clock; neither may trap.
        guard let seconds = TokenResponseParser.secondsUntil(a.expiresAt, from: wallClockNow), seconds > 0 else { return nil }
        let remaining = TokenResponseParser.clampedLifetime(seconds: seconds)
        guard remaining >= minimumRemaining else { return nil }
        return TokenGrant(accessToken: a.token, lifetime: remaining, lifetimeSource: .expiresIn, refreshToken: refreshToken)
    }
}

/// "Adopt if newer" rules for a refresh_token session's refresh token. Pure.
public enum RefreshTokenAdoption {
    /// Which refresh token to start from (startup, SIGHUP, or the operator file changed).
    public enum Source: Sendable, Equatable {
        /// The `refresh_token_file` content: there is no usable state, or the operator put a
        /// different file in place since the state was derived.
        case operatorFile
        /// The state file: it descends from the current operator file (our own rotations).
        case stateFile
        /// Neither exists: the session needs a refresh token.
        case none
    }

    /// - Parameters:
    ///   - operatorFileFingerprint: `BearerdOAuth.fingerprint(bytes:)` of the current
    ///     `refresh_token_file` content (trimmed as the driver reads it), nil if absent.
    ///   - stored: the decoded state file, nil if absent or unreadable.
    public static func startingSource(operatorFileFingerprint: String?, stored: PersistedSessionState?) -> Source {
        switch (operatorFileFingerprint, stored) {
        case (nil, nil): return .none
        case (nil, _?): return .stateFile
        case (_?, nil): return .operatorFile
        case (let f?, let s?):
            // A state without lineage predates fingerprints: trust it only if there is no
            // file to compare with, which is not the case here.
            return s.sourceFingerprint == f ? .stateFile : .operatorFile
        }
    }

    /// What to do with the state file re-read under the lock, before sending a refresh.
    public enum UnderLock: Sendable, Equatable {
        /// Nothing newer: send our refresh request.
        case refreshWithOwn
        /// Another process rotated the refresh token: switch to the stored one (and its
        /// access token if still good) without calling the server for what it already did.
        case adoptStored
    }

    /// Rules: a different refresh token from the same lineage, written no earlier than ours,
    /// was rotated by another process (we always persist before use) → adopt. The same refresh
    /// token with a later-expiring access token → adopt (another process refreshed without
    /// rotation). A different lineage is an operator change, handled by `startingSource`.
    public static func underLock(stored: PersistedSessionState?, own: PersistedSessionState) -> UnderLock {
        guard let s = stored, s.sourceFingerprint == own.sourceFingerprint else { return .refreshWithOwn }
        if s.refreshToken != own.refreshToken {
            return s.updatedAt >= own.updatedAt ? .adoptStored : .refreshWithOwn
        }
        if let sa = s.accessToken, sa.expiresAt > (own.accessToken?.expiresAt ?? .min), sa.token != own.accessToken?.token {
            return .adoptStored
        }
        return .refreshWithOwn
    }
}
