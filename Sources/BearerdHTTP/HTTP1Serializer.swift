// STUB: to be replaced by the full serializer (owned by the HTTP helper).
public enum HTTP1Serializer {
    public static func writeRequestHead(_ head: HTTPRequestHead, into buffer: inout [UInt8]) {}
    public static func writeResponseHead(_ head: HTTPResponseHead, into buffer: inout [UInt8]) {}
    public static func writeChunk(_ bytes: UnsafeRawBufferPointer, into buffer: inout [UInt8]) {}
    public static func writeLastChunk(trailers: HTTPHeaders?, into buffer: inout [UInt8]) {}
}

/// Header rules of RFC 9110 §7.6.1 and RFC 9112 §9 (connection management).
public enum HTTPHeaderRules {
    public static func removeHopByHop(_ headers: inout HTTPHeaders) {}
    public static func connectionTokens(_ headers: HTTPHeaders) -> [String] { [] }
    public static func keepAlive(version: HTTPVersion, headers: HTTPHeaders) -> Bool { true }
    public static func expectsContinue(_ head: HTTPRequestHead) -> Bool { false }
}
