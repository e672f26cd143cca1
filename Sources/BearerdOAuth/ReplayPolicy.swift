/// The "401 → refresh → replay once" decision of DESIGN §6, for one upstream response.
///
/// Pure: everything it looks at is an argument. The pipeline acts on the decision; the
/// compare-and-swap of the rejected generation, the coalesced refresh and the breaker live in
/// `TokenSession.StateMachine.upstreamRejected(generation:waiter:now:)`.
public enum ReplayPolicy {
    public enum Decision: Sendable, Equatable {
        /// Hand the response to the client as is.
        case passThrough
        /// The request carried an older generation than the current one: replay at once with
        /// the current token, no refresh.
        case replayNow
        /// The current generation was rejected: drain the body, call `upstreamRejected` with a
        /// waiter (marks the generation invalid, joins or starts the one refresh), replay once
        /// with the token the waiter gets; if it gets a failure, pass the rejection through.
        case refreshThenReplay
        /// The request cannot be replayed (body not kept, method excluded): call
        /// `upstreamRejected` without a waiter so later requests get a fresh token, and pass
        /// this rejection to the client.
        case refreshOnlyPassThrough
    }

    /// The facts about one upstream response.
    public struct Input: Sendable, Equatable {
        public var status: Int
        /// `reject_statuses` of the route (default `[401]`).
        public var rejectStatuses: Set<Int>
        /// Every `WWW-Authenticate` field value of the response, in order.
        public var wwwAuthenticate: [String]
        /// The generation of the token the request carried.
        public var requestGeneration: UInt64
        /// The session's current generation.
        public var currentGeneration: UInt64
        /// The whole request body is held (≤ `replay_body_limit`, not streaming).
        public var bodyFullyKept: Bool
        /// The method is in `replay_methods`.
        public var methodAllowed: Bool
        /// This response already answers a replay.
        public var alreadyReplayed: Bool

        public init(status: Int, rejectStatuses: Set<Int> = [401], wwwAuthenticate: [String] = [],
                    requestGeneration: UInt64, currentGeneration: UInt64, bodyFullyKept: Bool = true,
                    methodAllowed: Bool = true, alreadyReplayed: Bool = false) {
            self.status = status
            self.rejectStatuses = rejectStatuses
            self.wwwAuthenticate = wwwAuthenticate
            self.requestGeneration = requestGeneration
            self.currentGeneration = currentGeneration
            self.bodyFullyKept = bodyFullyKept
            self.methodAllowed = methodAllowed
            self.alreadyReplayed = alreadyReplayed
        }
    }

    /// Whether the `WWW-Authenticate` fields say the token was rejected: absent, no `error`
    /// in any Bearer challenge, or `error="invalid_token"` (RFC 6750 §3.1). Any other Bearer
    /// `error` (notably `insufficient_scope`) means it was not about the token. An unparsable
    /// field gives no information and counts as absent.
    public static func challengesBlameToken(_ values: [String]) -> Bool {
        guard let challenges = try? WWWAuthenticate.parse(values) else { return true }
        for c in challenges where c.isBearer {
            if let error = c.parameter("error"), error != "invalid_token" { return false }
        }
        return true
    }

    public static func decide(_ input: Input) -> Decision {
        guard input.rejectStatuses.contains(input.status), !input.alreadyReplayed,
              challengesBlameToken(input.wwwAuthenticate) else { return .passThrough }
        let replayable = input.bodyFullyKept && input.methodAllowed
        if input.requestGeneration < input.currentGeneration {
            return replayable ? .replayNow : .passThrough
        }
        return replayable ? .refreshThenReplay : .refreshOnlyPassThrough
    }
}
