/// Parser limits (the defaults of docs/architecture.md §4 `limits:`, where they are configurable).
public struct HTTP1Limits: Sendable, Equatable {
    /// Largest request or status line plus all header fields, in bytes. Exceeding it: 431.
    public var maxHeaderBytes: Int = 64 * 1024
    /// Longest request target, in bytes. Exceeding it: 414.
    public var maxRequestTarget: Int = 8 * 1024
    /// Most header fields (trailer fields count separately against the same limit). Exceeding it: 431.
    public var maxHeaderCount: Int = 100
    public init() {}
    public init(maxHeaderBytes: Int, maxRequestTarget: Int, maxHeaderCount: Int) {
        self.maxHeaderBytes = maxHeaderBytes
        self.maxRequestTarget = maxRequestTarget
        self.maxHeaderCount = maxHeaderCount
    }
}
