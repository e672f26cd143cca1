/// The "401 → refresh → replay once" decision of docs/architecture.md §6, for one upstream response.
///
/// Pure: everything it looks at is an argument. It decides only whether a response is a
/// rejection of our token and whether the request can be sent again; *which* token the replay
/// carries (the current newer one at once, or the one of the coalesced refresh) is decided by the
/// session alone (`TokenSession.StateMachine.upstreamRejected(generation:waiter:now:)`), so no
/// generation is compared here or in the pipeline.
public enum ReplayPolicy {
    public enum Decision: Sendable, Equatable {
        /// Not a rejection (status not in `reject_statuses`): relay it.
        case notRejected
        /// A rejection of our token that can be replayed: hold it, report it to the session,
        /// replay once with the token the session gives (or relay it if the session gives none).
        case replay
        /// A rejection that is relayed as it is, for `reason`; the session is not told.
        case passThrough(Reason)
        /// A rejection of our token that cannot be replayed (`reason`): tell the session without
        /// waiting (later requests get a fresh token) and relay this one.
        case refreshOnlyPassThrough(Reason)
    }

    /// Why a rejection was not replayed (the `outcome` label of the replay counter).
    public enum Reason: Sendable, Equatable {
        /// The replay was rejected too.
        case rejectedAgain
        /// `WWW-Authenticate` names another error than `invalid_token` (e.g. `insufficient_scope`).
        case notTokenError
        /// The body is over `replay_body_limit` (or was not kept).
        case notReplayable
        /// The method is not in `replay_methods`.
        case methodNotAllowed
        /// The rejection's own body was too large to hold while deciding.
        case rejectionTooLarge
    }

    /// The facts about one upstream response.
    public struct Input: Sendable, Equatable {
        public var status: Int
        /// `reject_statuses` of the route (default `[401]`; a few entries, so an array).
        public var rejectStatuses: [Int]
        /// Every `WWW-Authenticate` field value of the response, in order.
        public var wwwAuthenticate: [String]
        /// The whole request body is, or can still be, kept (≤ `replay_body_limit`). A body
        /// still streaming counts: the rest is read into the kept copy before the replay.
        public var bodyReplayable: Bool
        /// The method is in `replay_methods`.
        public var methodAllowed: Bool
        /// This response already answers a replay.
        public var alreadyReplayed: Bool
        /// A trailers-only gRPC response with `grpc-status: 16` (UNAUTHENTICATED): a rejection
        /// whatever its HTTP status (docs/architecture.md §5).
        public var grpcUnauthenticated: Bool = false

        public init(status: Int, rejectStatuses: [Int] = [401], wwwAuthenticate: [String] = [],
                    bodyReplayable: Bool = true, methodAllowed: Bool = true, alreadyReplayed: Bool = false) {
            self.status = status
            self.rejectStatuses = rejectStatuses
            self.wwwAuthenticate = wwwAuthenticate
            self.bodyReplayable = bodyReplayable
            self.methodAllowed = methodAllowed
            self.alreadyReplayed = alreadyReplayed
        }
    }

    /// Whether the `WWW-Authenticate` fields say the token was rejected: absent, no `error`
    /// in any Bearer (or DPoP) challenge, or `error="invalid_token"` (RFC 6750 §3.1). Any other
    /// `error` (notably `insufficient_scope`) means it was not about the token. An unparsable
    /// field gives no information and counts as absent.
    public static func challengesBlameToken(_ values: [String]) -> Bool {
        guard let challenges = try? WWWAuthenticate.parse(values) else { return true }
        // RFC 9449 §7.1: a DPoP challenge carries the same RFC 6750 error codes.
        for c in challenges where c.isBearer || c.scheme.lowercased() == "dpop" {
            if let error = c.parameter("error"), error != "invalid_token" { return false }
        }
        return true
    }

    public static func decide(_ input: Input) -> Decision {
        guard input.rejectStatuses.contains(input.status) || input.grpcUnauthenticated else { return .notRejected }
        if input.alreadyReplayed { return .passThrough(.rejectedAgain) }
        guard challengesBlameToken(input.wwwAuthenticate) else { return .passThrough(.notTokenError) }
        if !input.bodyReplayable { return .refreshOnlyPassThrough(.notReplayable) }
        if !input.methodAllowed { return .refreshOnlyPassThrough(.methodNotAllowed) }
        return .replay
    }
}
