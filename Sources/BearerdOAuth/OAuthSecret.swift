/// A secret string (client secret, password, refresh or access token).
///
/// Owns the value only; it prints as `<redacted>` in `description`, `debugDescription` and
/// string interpolation, and compares in constant time with respect to the contents
/// (the length still leaks, as it does on the wire). Read the value only where it must go
/// on the wire or to disk, through `exposedValue`.
public struct OAuthSecret: Sendable, Equatable, Hashable, CustomStringConvertible, CustomDebugStringConvertible {
    /// The secret itself. Never log it; log `fingerprint` instead.
    public let exposedValue: String

    public init(_ value: String) { self.exposedValue = value }

    public var description: String { "<redacted>" }
    public var debugDescription: String { "<redacted>" }

    /// First 8 hex digits of SHA-256 of the value: what logs show instead of the secret.
    public var fingerprint: String { BearerdOAuth.fingerprint(exposedValue) }

    public var isEmpty: Bool { exposedValue.isEmpty }

    public static func == (a: OAuthSecret, b: OAuthSecret) -> Bool {
        constantTimeEqual(Array(a.exposedValue.utf8), Array(b.exposedValue.utf8))
    }

    public func hash(into hasher: inout Hasher) { hasher.combine(exposedValue) }
}

/// Compares two byte strings without an early exit on the first difference.
func constantTimeEqual(_ x: [UInt8], _ y: [UInt8]) -> Bool {
    var diff: UInt64 = UInt64(truncatingIfNeeded: x.count ^ y.count)
    let n = Swift.max(x.count, y.count)
    for i in 0..<n {
        let a = i < x.count ? x[i] : 0
        let b = i < y.count ? y[i] : 0
        diff |= UInt64(a ^ b)
    }
    return diff == 0
}
