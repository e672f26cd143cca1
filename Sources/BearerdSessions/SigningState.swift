import Synchronization

/// What the loops share with a signing session (`grant: aws`, `grant: aliyun`;
/// docs/architecture.md §6.15) without going through its queue: the clock offset requests are
/// signed with, and the counters `/metrics` shows. Any thread, lock-free.
///
/// Invariant: `clockOffsetSeconds` changes only when a server said `RequestTimeTooSkewed` with
/// its time (`adoptServerTime`), and is bounded to ±1 day, so a hostile answer cannot push the
/// signing clock further than a day from the host's.
public final class SigningState: Sendable {
    private let offset = Atomic<Int64>(0)
    private let signedCount = Atomic<UInt64>(0)
    private let rejectionCount = Atomic<UInt64>(0)
    private let skewCount = Atomic<UInt64>(0)
    private let mismatchCount = Atomic<UInt64>(0)

    /// The largest offset adopted from a server's time (one day).
    public static let maximumOffsetSeconds: Int64 = 86_400

    public init() {}

    /// Seconds added to the host's clock when signing (server time − host time).
    public var clockOffsetSeconds: Int64 { offset.load(ordering: .relaxed) }

    /// A server answered `RequestTimeTooSkewed` with its time `serverEpochSeconds` while the host
    /// read `hostEpochSeconds`: sign with the server's clock from now on. Returns the new offset.
    @discardableResult
    public func adoptServerTime(_ serverEpochSeconds: Int64, hostEpochSeconds: Int64) -> Int64 {
        let (d, overflow) = serverEpochSeconds.subtractingReportingOverflow(hostEpochSeconds)
        let bounded = overflow ? (serverEpochSeconds < 0 ? -Self.maximumOffsetSeconds : Self.maximumOffsetSeconds)
            : min(max(d, -Self.maximumOffsetSeconds), Self.maximumOffsetSeconds)
        offset.store(bounded, ordering: .relaxed)
        skewCount.add(1, ordering: .relaxed)
        return bounded
    }

    /// The time to sign with, given the host's.
    public func signingTime(hostEpochSeconds: Int64) -> Int64 {
        hostEpochSeconds.addingReportingOverflow(clockOffsetSeconds).overflow ? hostEpochSeconds
            : hostEpochSeconds &+ clockOffsetSeconds
    }

    public func countSigned() { signedCount.add(1, ordering: .relaxed) }
    /// The upstream said the keys are no longer good (`ExpiredToken`, `InvalidAccessKeyId`, …).
    public func countRejection() { rejectionCount.add(1, ordering: .relaxed) }
    /// The upstream said `SignatureDoesNotMatch`.
    public func countSignatureMismatch() { mismatchCount.add(1, ordering: .relaxed) }

    /// A snapshot for `/metrics`.
    public var counters: Counters {
        Counters(signedRequests: signedCount.load(ordering: .relaxed), credentialRejections: rejectionCount.load(ordering: .relaxed),
                 skewAdoptions: skewCount.load(ordering: .relaxed), signatureMismatches: mismatchCount.load(ordering: .relaxed),
                 clockOffsetSeconds: clockOffsetSeconds)
    }

    public struct Counters: Sendable, Equatable {
        public var signedRequests: UInt64
        public var credentialRejections: UInt64
        public var skewAdoptions: UInt64
        public var signatureMismatches: UInt64
        public var clockOffsetSeconds: Int64
    }
}
