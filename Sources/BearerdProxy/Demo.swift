import BearerdHTTP
import BearerdIO

/// The demo upstream of `bearerd demo`: answers every request with a JSON description of what
/// it received (method, target, headers), so a newcomer sees what bearerd forwarded.
/// Stateless; runs on whichever loop the connection is on.
public final class EchoResponder: LocalResponder, @unchecked Sendable {  // @unchecked: no mutable state
    public init() {}

    public func respond(to head: HTTPRequestHead, body: [UInt8], loop: EventLoop, reply: @escaping (HTTPResponseHead, [UInt8]) -> Void) {
        var s = "{\"upstream\":\"bearerd demo echo\",\"method\":" + ErrorResponse.jsonString(head.method)
        s += ",\"target\":" + ErrorResponse.jsonString(head.target) + ",\"headers\":{"
        s += head.headers.fields.map { f in
            ErrorResponse.jsonString(f.name) + ":" + ErrorResponse.jsonString(f.value)
        }.joined(separator: ",")
        s += "},\"body_bytes\":\(body.count)}\n"
        reply(HTTPResponseHead(status: 200, reason: "OK", headers: ["Content-Type": "application/json"]), Array(s.utf8))
    }
}
