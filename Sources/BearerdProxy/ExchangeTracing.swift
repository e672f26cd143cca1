import BearerdHTTP
import BearerdSessions

extension ExchangeTrace {
    /// Sends the upstream head with `traceparent` naming this exchange's span
    /// (docs/architecture.md §2.9). Only sampled exchanges copy the head; the others send it as is.
    func sendHead(_ head: HTTPRequestHead, on conn: UpstreamStream, body: HTTP1BodyFraming, upgrade: Bool, teTrailers: Bool, credential: HTTPField?) {
        conn.sendHead(propagated(head), body: body, upgrade: upgrade, teTrailers: teTrailers, credential: credential)
    }
}
