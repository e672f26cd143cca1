// STUB: to be replaced by the full parser (owned by the HTTP helper).

/// Incremental, strict, sans-IO HTTP/1.1 parser (h11 shape). See the full implementation.
public struct HTTP1Parser: Sendable {
    public enum Role: Sendable { case server, client }
    public let role: Role
    public let limits: HTTP1Limits
    public init(role: Role, limits: HTTP1Limits = HTTP1Limits()) {
        self.role = role
        self.limits = limits
    }
    /// Append received bytes.
    public mutating func feed(_ bytes: UnsafeRawBufferPointer) {}
    public mutating func feed(_ bytes: [UInt8]) {}
    /// The peer closed its sending side.
    public mutating func feedEOF() {}
    /// Client role: the next response (in order) answers a request with this method.
    public mutating func expectResponse(to method: String) {}
    /// The next event, or nil when more input is needed.
    public mutating func next() throws(HTTP1Error) -> HTTP1Event? { nil }
    /// Bytes received and not yet returned as events.
    public var bufferedByteCount: Int { 0 }
    /// True between messages (no message in progress, possibly buffered bytes of the next).
    public var isBetweenMessages: Bool { true }
}
