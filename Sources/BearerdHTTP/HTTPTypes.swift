/// One header field as received (name case preserved) or to be sent. Invariant: `known` is
/// `KnownField(name)`, computed when the field is made or renamed (the parser passes what it
/// found in the bytes), so the rules that look for hop-by-hop and rewritten fields read it
/// instead of classifying the name again at every step of a request (measured, bench/RESULTS.md).
public struct HTTPField: Sendable, Equatable {
    public var name: String {
        didSet { known = KnownField(name) }
    }
    public var value: String
    /// `name` classified: the fields the proxy treats specially, or `.other`.
    public private(set) var known: KnownField

    public init(name: String, value: String) {
        self.name = name
        self.value = value
        known = KnownField(name)
    }

    /// A field whose name was already classified (`known == KnownField(name)`; the parser).
    init(name: String, value: String, known: KnownField) {
        self.name = name
        self.value = value
        self.known = known
    }

    // The fields the proxy writes itself, made without classifying their names again.
    public static func host(_ value: String) -> HTTPField { HTTPField(name: "Host", value: value, known: .host) }
    public static func xForwardedFor(_ value: String) -> HTTPField { HTTPField(name: "X-Forwarded-For", value: value, known: .xForwardedFor) }
    public static func xForwardedProto(_ value: String) -> HTTPField { HTTPField(name: "X-Forwarded-Proto", value: value, known: .xForwardedProto) }
    public static func xForwardedHost(_ value: String) -> HTTPField { HTTPField(name: "X-Forwarded-Host", value: value, known: .xForwardedHost) }
    public static func contentLength(_ value: String) -> HTTPField { HTTPField(name: "Content-Length", value: value, known: .contentLength) }
    public static func transferEncoding(_ value: String) -> HTTPField { HTTPField(name: "Transfer-Encoding", value: value, known: .transferEncoding) }
    public static func connection(_ value: String) -> HTTPField { HTTPField(name: "Connection", value: value, known: .connection) }
    public static func via(_ value: String) -> HTTPField { HTTPField(name: "Via", value: value, known: .via) }
}

/// An ordered list of header fields. Lookups are ASCII case-insensitive (RFC 9110 §5.1).
/// Value semantics; no invariants beyond those the parser checked on input.
public struct HTTPHeaders: Sendable, Equatable, Sequence, ExpressibleByDictionaryLiteral {
    public var fields: [HTTPField]

    public init() { fields = [] }
    public init(_ fields: [HTTPField]) { self.fields = fields }
    public init(_ pairs: [(String, String)]) { fields = pairs.map { HTTPField(name: $0.0, value: $0.1) } }
    public init(dictionaryLiteral elements: (String, String)...) { self.init(elements) }

    public var count: Int { fields.count }
    public func makeIterator() -> IndexingIterator<[HTTPField]> { fields.makeIterator() }

    /// First value of a field the proxy knows by kind (no name comparison), or nil.
    public func first(_ kind: KnownField) -> String? {
        // By index: reads one byte per field instead of copying (retaining) each field.
        for i in fields.indices where fields[i].known == kind { return fields[i].value }
        return nil
    }

    /// Whether a field of that kind is there.
    public func contains(_ kind: KnownField) -> Bool {
        for i in fields.indices where fields[i].known == kind { return true }
        return false
    }

    /// First value of `name`, or nil.
    public subscript(name: String) -> String? {
        for f in fields where asciiCaseInsensitiveEquals(f.name, name) { return f.value }
        return nil
    }

    /// Every value of `name`, in order.
    public func values(_ name: String) -> [String] {
        fields.compactMap { asciiCaseInsensitiveEquals($0.name, name) ? $0.value : nil }
    }

    public func contains(_ name: String) -> Bool {
        fields.contains { asciiCaseInsensitiveEquals($0.name, name) }
    }

    public mutating func add(_ name: String, _ value: String) {
        fields.append(HTTPField(name: name, value: value))
    }

    /// Replaces every field called `name` with one field (set, never add).
    public mutating func set(_ name: String, _ value: String) {
        if let i = fields.firstIndex(where: { asciiCaseInsensitiveEquals($0.name, name) }) {
            fields[i].value = value
            var j = fields.count - 1
            while j > i {
                if asciiCaseInsensitiveEquals(fields[j].name, name) { fields.remove(at: j) }
                j -= 1
            }
        } else {
            add(name, value)
        }
    }

    public mutating func remove(_ name: String) {
        fields.removeAll { asciiCaseInsensitiveEquals($0.name, name) }
    }
}

public struct HTTPVersion: Sendable, Equatable, Hashable, CustomStringConvertible {
    public var major: Int
    public var minor: Int
    public init(major: Int, minor: Int) {
        self.major = major
        self.minor = minor
    }
    public static let http1_0 = HTTPVersion(major: 1, minor: 0)
    public static let http1_1 = HTTPVersion(major: 1, minor: 1)
    public var description: String { "HTTP/\(major).\(minor)" }
}

/// A parsed request line and header section.
public struct HTTPRequestHead: Sendable, Equatable {
    public var method: String
    /// The request target exactly as received (origin-form, absolute-form, authority-form or "*").
    public var target: String
    public var version: HTTPVersion
    public var headers: HTTPHeaders
    public init(method: String, target: String, version: HTTPVersion = .http1_1, headers: HTTPHeaders = HTTPHeaders()) {
        self.method = method
        self.target = target
        self.version = version
        self.headers = headers
    }
}

/// A parsed status line and header section.
public struct HTTPResponseHead: Sendable, Equatable {
    public var status: Int
    public var reason: String
    public var version: HTTPVersion
    public var headers: HTTPHeaders
    public init(status: Int, reason: String = "", version: HTTPVersion = .http1_1, headers: HTTPHeaders = HTTPHeaders()) {
        self.status = status
        self.reason = reason
        self.version = version
        self.headers = headers
    }
    public var isInformational: Bool { status >= 100 && status < 200 }
}

/// How a message body is delimited (RFC 9112 §6).
public enum HTTP1BodyFraming: Sendable, Equatable {
    /// No body (requests without CL/TE, HEAD responses, 1xx, 204, 304, CL: 0).
    case none
    case contentLength(UInt64)
    case chunked
    /// Response body that ends when the connection closes (RFC 9112 §6.3 rule 8).
    case closeDelimited
}

/// What the parser found.
public enum HTTP1Event: Sendable, Equatable {
    case requestHead(HTTPRequestHead, framing: HTTP1BodyFraming)
    /// A response head. Informational (1xx) heads have framing `.none` and are followed by another head.
    case responseHead(HTTPResponseHead, framing: HTTP1BodyFraming)
    /// A piece of body (never empty). Chunked framing is already removed.
    case body(ArraySlice<UInt8>)
    /// End of the message; trailers only for chunked bodies that carried some.
    case end(trailers: HTTPHeaders?)
}

/// A protocol error with a stable reason (`http1.cl_and_te`), the status the peer should get
/// (400, 414, 431, 501, 505; for responses the proxy turns any of them into a 502), and the
/// offset in the connection's byte stream where the fault was found.
public struct HTTP1Error: Error, Sendable, Equatable, CustomStringConvertible {
    public var reason: String
    public var status: Int
    public var offset: Int
    public var message: String
    public init(reason: String, status: Int = 400, offset: Int, message: String) {
        self.reason = reason
        self.status = status
        self.offset = offset
        self.message = message
    }
    public var description: String { "\(reason) at byte \(offset): \(message)" }
}

/// ASCII case-insensitive equality of two strings (header names, tokens). Compares lengths
/// first (O(1) for native strings) and then the contiguous UTF-8 bytes.
@inline(__always)
public func asciiCaseInsensitiveEquals(_ a: String, _ b: String) -> Bool {
    let ua = a.utf8, ub = b.utf8
    guard ua.count == ub.count else { return false }
    if let r = ua.withContiguousStorageIfAvailable({ pa in ub.withContiguousStorageIfAvailable({ pb in asciiCaseInsensitiveEquals(pa, pb) }) }),
       let r {
        return r
    }
    return asciiCaseInsensitiveEquals(Array(ua)[...], Array(ub)[...])
}

@inline(__always)
func asciiCaseInsensitiveEquals<A: RandomAccessCollection<UInt8>, B: RandomAccessCollection<UInt8>>(_ a: A, _ b: B) -> Bool
    where A.Index == Int, B.Index == Int {
    guard a.count == b.count else { return false }
    var i = a.startIndex, j = b.startIndex
    while i < a.endIndex {
        let x = a[i], y = b[j]
        if x != y {
            let lx = (x >= 65 && x <= 90) ? x | 0x20 : x
            let ly = (y >= 65 && y <= 90) ? y | 0x20 : y
            if lx != ly { return false }
        }
        i += 1
        j += 1
    }
    return true
}

/// The header fields the proxy treats specially (RFC 9110 §7.6.1 hop-by-hop fields and those it
/// rewrites), recognised by length and then by bytes: one classification per field replaces a
/// scan of every field per rule on the request path.
public enum KnownField: Sendable, Equatable {
    case connection, keepAlive, proxyConnection, te, transferEncoding, upgrade, trailer
    case proxyAuthenticate, proxyAuthorization
    case expect, contentLength, host, xForwardedFor, xForwardedProto, xForwardedHost, via
    /// Read for every request (the browser guard, gRPC detection): found by kind, not by name.
    case origin, secFetchSite, contentType
    case other

    /// Fields that are hop-by-hop whether or not `Connection` names them (RFC 9110 §7.6.1, plus
    /// the legacy `Keep-Alive` and `Proxy-Connection`, and `Proxy-Authenticate`/`-Authorization`
    /// which are meant for the next hop only).
    public var isHopByHop: Bool {
        switch self {
        case .connection, .keepAlive, .proxyConnection, .te, .transferEncoding, .upgrade, .trailer,
             .proxyAuthenticate, .proxyAuthorization:
            return true
        default:
            return false
        }
    }

    public init(_ name: String) {
        var name = name
        self = name.withUTF8 { KnownField.classify($0) }
    }

    static func classify(_ b: UnsafeBufferPointer<UInt8>) -> KnownField {
        @inline(__always) func eq(_ lower: StaticString) -> Bool { HTTP1Syntax.equalsLowercase(b, lower) }
        switch b.count {
        case 2: return eq("te") ? .te : .other
        case 3: return eq("via") ? .via : .other
        case 4: return eq("host") ? .host : .other
        case 6: return eq("expect") ? .expect : eq("origin") ? .origin : .other
        case 7: return eq("upgrade") ? .upgrade : eq("trailer") ? .trailer : .other
        case 10: return eq("connection") ? .connection : eq("keep-alive") ? .keepAlive : .other
        case 12: return eq("content-type") ? .contentType : .other
        case 14: return eq("content-length") ? .contentLength : eq("sec-fetch-site") ? .secFetchSite : .other
        case 15: return eq("x-forwarded-for") ? .xForwardedFor : .other
        case 16: return eq("proxy-connection") ? .proxyConnection : eq("x-forwarded-host") ? .xForwardedHost : .other
        case 17: return eq("transfer-encoding") ? .transferEncoding : eq("x-forwarded-proto") ? .xForwardedProto : .other
        case 18: return eq("proxy-authenticate") ? .proxyAuthenticate : .other
        case 19: return eq("proxy-authorization") ? .proxyAuthorization : .other
        default: return .other
        }
    }
}
