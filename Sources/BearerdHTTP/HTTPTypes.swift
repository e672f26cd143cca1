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
/// Value semantics. Storage: a parsed head's field lines as bytes in one buffer per head
/// (`bytes`, copied once from the input), and per field its `KnownField` and the byte ranges of
/// its name and value (`Entry`, a plain value: copying or dropping one touches no reference
/// count). No `String` is made for a parsed field unless someone asks (`fields`, `name(at:)`,
/// `value(at:)`, lookups returning values); the serializer and the proxy's rules read the bytes.
/// A field added from Strings (the proxy's own, HTTP/2's, tests'), or a value changed, keeps its
/// Strings in `strings` and the entry holds their index. Invariants: every byte range lies in
/// `bytes` and is valid UTF-8 (the parser refuses values that are not); every string index is
/// in `strings`; `bytes` only grows by whole parsed lines, so heads made with
/// `init(sharingBytesOf:)` share it and copy entries between them without copying a byte.
public struct HTTPHeaders: Sendable, Sequence, ExpressibleByDictionaryLiteral {
    /// One field: where its name and value are, and its name classified. `name`/`value` are an
    /// index in `strings` (the range is then unused), or -1 for the range in `bytes`.
    @usableFromInline
    struct Entry: Sendable {
        @usableFromInline var nameStart: Int
        @usableFromInline var nameEnd: Int
        @usableFromInline var valueStart: Int
        @usableFromInline var valueEnd: Int
        @usableFromInline var name: Int
        @usableFromInline var value: Int
        @usableFromInline var known: KnownField
    }

    @usableFromInline var bytes: [UInt8]
    @usableFromInline var entries: [Entry]
    @usableFromInline var strings: [String]

    public init() {
        bytes = []
        entries = []
        strings = []
    }

    /// No fields, with `other`'s byte buffer (shared, not copied), so `append(from: other, at:)`
    /// copies an entry only.
    public init(sharingBytesOf other: HTTPHeaders, capacity: Int) {
        bytes = other.bytes
        entries = []
        entries.reserveCapacity(capacity)
        strings = []
    }

    public init(_ fields: [HTTPField]) {
        self.init()
        append(contentsOf: fields)
    }

    public init(_ pairs: [(String, String)]) {
        self.init()
        for (n, v) in pairs { add(n, v) }
    }

    public init(dictionaryLiteral elements: (String, String)...) { self.init(elements) }

    /// The fields as `HTTPField`s (Strings made here). Setting replaces every field.
    public var fields: [HTTPField] {
        get {
            var out: [HTTPField] = []
            out.reserveCapacity(entries.count)
            for i in entries.indices { out.append(field(at: i)) }
            return out
        }
        set {
            removeAll()
            append(contentsOf: newValue)
        }
    }

    public var count: Int { entries.count }
    public var isEmpty: Bool { entries.isEmpty }
    public var indices: Range<Int> { entries.indices }
    public func makeIterator() -> IndexingIterator<[HTTPField]> { fields.makeIterator() }

    /// Field `i` as an `HTTPField` (its two Strings made here).
    public func field(at i: Int) -> HTTPField {
        HTTPField(name: name(at: i), value: value(at: i), known: entries[i].known)
    }

    /// The name of field `i`, as received (case preserved).
    public func name(at i: Int) -> String {
        let e = entries[i]
        if e.name >= 0 { return strings[e.name] }
        return bytes.withUnsafeBufferPointer { p in
            let b = UnsafeBufferPointer(rebasing: p[e.nameStart..<e.nameEnd])
            return CommonStrings.fieldName(b) ?? String(decoding: b, as: UTF8.self)
        }
    }

    /// The value of field `i` (OWS-trimmed for parsed fields).
    public func value(at i: Int) -> String {
        let e = entries[i]
        if e.value >= 0 { return strings[e.value] }
        return bytes.withUnsafeBufferPointer { p in
            let b = UnsafeBufferPointer(rebasing: p[e.valueStart..<e.valueEnd])
            // Up to 15 bytes a String is stored inline (nothing to share); longer common values
            // are shared constants.
            if b.count <= 15 { return String(decoding: b, as: UTF8.self) }
            return CommonStrings.fieldValue(b) ?? String(decoding: b, as: UTF8.self)
        }
    }

    /// The classification of field `i`'s name.
    @inlinable
    public func known(at i: Int) -> KnownField { entries[i].known }

    /// Calls `body` with the name and value bytes of field `i` (valid only during the call).
    @inlinable
    public func withBytes<R>(at i: Int, _ body: (_ name: UnsafeBufferPointer<UInt8>, _ value: UnsafeBufferPointer<UInt8>) throws -> R) rethrows -> R {
        let e = entries[i]
        return try bytes.withUnsafeBufferPointer { p in
            try withName(of: e, in: p) { n in
                try withValue(of: e, in: p) { v in try body(n, v) }
            }
        }
    }

    /// The name bytes of `e`, whose ranges are into `p`.
    @inlinable
    func withName<R>(of e: Entry, in p: UnsafeBufferPointer<UInt8>, _ body: (UnsafeBufferPointer<UInt8>) throws -> R) rethrows -> R {
        if e.name < 0 { return try body(UnsafeBufferPointer(rebasing: p[e.nameStart..<e.nameEnd])) }
        var s = strings[e.name]
        return try s.withUTF8(body)
    }

    /// The value bytes of `e`, whose ranges are into `p`.
    @inlinable
    func withValue<R>(of e: Entry, in p: UnsafeBufferPointer<UInt8>, _ body: (UnsafeBufferPointer<UInt8>) throws -> R) rethrows -> R {
        if e.value < 0 { return try body(UnsafeBufferPointer(rebasing: p[e.valueStart..<e.valueEnd])) }
        var s = strings[e.value]
        return try s.withUTF8(body)
    }

    /// Whether field `i` is called `name` (ASCII case-insensitive), without making a String.
    public func nameEquals(at i: Int, _ name: String) -> Bool {
        let e = entries[i]
        var name = name
        return name.withUTF8 { n in
            bytes.withUnsafeBufferPointer { p in
                withName(of: e, in: p) { asciiCaseInsensitiveEquals($0, n) }
            }
        }
    }

    /// Bytes `HTTP1Serializer.putField` writes for every field, or more (an upper bound: the
    /// byte buffer also holds separators and lines no longer referenced).
    public var serializedSizeBound: Int {
        var n = bytes.count + 4 * entries.count
        for s in strings { n += s.utf8.count }
        return n
    }

    /// Index of the first field of that kind, or nil.
    public func firstIndex(_ kind: KnownField) -> Int? {
        for i in entries.indices where entries[i].known == kind { return i }
        return nil
    }

    /// First value of a field the proxy knows by kind (no name comparison), or nil.
    public func first(_ kind: KnownField) -> String? {
        firstIndex(kind).map { value(at: $0) }
    }

    /// Whether a field of that kind is there.
    public func contains(_ kind: KnownField) -> Bool {
        firstIndex(kind) != nil
    }

    /// Index of the first field called `name`, or nil.
    public func firstIndex(_ name: String) -> Int? {
        var name = name
        return name.withUTF8 { n in
            let known = KnownField.classify(n)
            return bytes.withUnsafeBufferPointer { p in
                for i in entries.indices where entries[i].known == known {
                    if withName(of: entries[i], in: p, { asciiCaseInsensitiveEquals($0, n) }) { return i }
                }
                return nil
            }
        }
    }

    /// First value of `name`, or nil.
    public subscript(name: String) -> String? {
        firstIndex(name).map { value(at: $0) }
    }

    /// Every value of `name`, in order.
    public func values(_ name: String) -> [String] {
        let known = KnownField(name)
        var out: [String] = []
        for i in entries.indices where entries[i].known == known && nameEquals(at: i, name) { out.append(value(at: i)) }
        return out
    }

    public func contains(_ name: String) -> Bool {
        firstIndex(name) != nil
    }

    mutating func append(name: String, value: String, known: KnownField) {
        let n = strings.count
        strings.append(name)
        strings.append(value)
        entries.append(Entry(nameStart: 0, nameEnd: 0, valueStart: 0, valueEnd: 0, name: n, value: n + 1, known: known))
    }

    /// Appends the parsed field line `p[line]` (one copy of its bytes), whose name and value
    /// are at `name` and `value` (indices of `p`, inside `line`).
    mutating func appendParsed(_ p: UnsafeBufferPointer<UInt8>, line: Range<Int>, name: Range<Int>, value: Range<Int>, known: KnownField) {
        let base = bytes.count - line.lowerBound
        bytes.append(contentsOf: UnsafeBufferPointer(rebasing: p[line]))
        entries.append(Entry(nameStart: base + name.lowerBound, nameEnd: base + name.upperBound,
                             valueStart: base + value.lowerBound, valueEnd: base + value.upperBound,
                             name: -1, value: -1, known: known))
    }

    public mutating func append(_ field: HTTPField) {
        append(name: field.name, value: field.value, known: field.known)
    }

    public mutating func append(contentsOf fields: [HTTPField]) {
        entries.reserveCapacity(entries.count + fields.count)
        for f in fields { append(f) }
    }

    /// Appends field `i` of `other`: its entry alone when both share one byte buffer
    /// (`init(sharingBytesOf:)`) and it is bytes, else its name and value as Strings.
    public mutating func append(from other: HTTPHeaders, at i: Int) {
        let e = other.entries[i]
        if e.name < 0 && e.value < 0 && sharesBytes(with: other) {
            entries.append(e)
        } else {
            append(name: other.name(at: i), value: other.value(at: i), known: e.known)
        }
    }

    /// Whether `bytes` is `other.bytes`'s storage (ranges of one are valid in the other).
    func sharesBytes(with other: HTTPHeaders) -> Bool {
        bytes.count == other.bytes.count
            && bytes.withUnsafeBufferPointer { a in other.bytes.withUnsafeBufferPointer { b in a.baseAddress == b.baseAddress } }
    }

    public mutating func reserveCapacity(_ n: Int) { entries.reserveCapacity(n) }

    public mutating func removeAll() {
        bytes.removeAll(keepingCapacity: true)
        entries.removeAll(keepingCapacity: true)
        strings.removeAll(keepingCapacity: true)
    }

    public mutating func add(_ name: String, _ value: String) {
        append(name: name, value: value, known: KnownField(name))
    }

    /// Replaces the value of field `i`.
    public mutating func setValue(at i: Int, _ value: String) {
        if entries[i].value >= 0 {
            strings[entries[i].value] = value
        } else {
            entries[i].value = strings.count
            strings.append(value)
        }
    }

    /// Makes field `i`'s value its old value followed by `suffix` (e.g. `", " + token`).
    public mutating func appendToValue(at i: Int, _ suffix: String) {
        setValue(at: i, value(at: i) + suffix)
    }

    /// Replaces every field called `name` with one field (set, never add).
    public mutating func set(_ name: String, _ value: String) {
        if let i = firstIndex(name) {
            setValue(at: i, value)
            let known = entries[i].known
            var j = entries.count - 1
            while j > i {
                if entries[j].known == known && nameEquals(at: j, name) { entries.remove(at: j) }
                j -= 1
            }
        } else {
            add(name, value)
        }
    }

    public mutating func remove(_ name: String) {
        let known = KnownField(name)
        var j = entries.count - 1
        while j >= 0 {
            if entries[j].known == known && nameEquals(at: j, name) { entries.remove(at: j) }
            j -= 1
        }
    }

    /// Removes field `i`.
    public mutating func remove(at i: Int) {
        entries.remove(at: i)
    }

    /// Removes every field for which `shouldRemove(i)` is true (`i` its index before removal).
    public mutating func removeFields(where shouldRemove: (Int) -> Bool) {
        var kept: [Entry] = []
        kept.reserveCapacity(entries.count)
        for i in entries.indices where !shouldRemove(i) { kept.append(entries[i]) }
        entries = kept
    }
}

extension HTTPHeaders: Equatable {
    /// Equal when the fields are, in order, byte for byte (names with their case).
    public static func == (a: HTTPHeaders, b: HTTPHeaders) -> Bool {
        guard a.entries.count == b.entries.count else { return false }
        for i in a.entries.indices {
            let same = a.withBytes(at: i) { an, av in
                b.withBytes(at: i) { bn, bv in an.elementsEqual(bn) && av.elementsEqual(bv) }
            }
            if !same { return false }
        }
        return true
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
        case 6: return eq("expect") ? .expect : .other
        case 7: return eq("upgrade") ? .upgrade : eq("trailer") ? .trailer : .other
        case 10: return eq("connection") ? .connection : eq("keep-alive") ? .keepAlive : .other
        case 14: return eq("content-length") ? .contentLength : .other
        case 15: return eq("x-forwarded-for") ? .xForwardedFor : .other
        case 16: return eq("proxy-connection") ? .proxyConnection : eq("x-forwarded-host") ? .xForwardedHost : .other
        case 17: return eq("transfer-encoding") ? .transferEncoding : eq("x-forwarded-proto") ? .xForwardedProto : .other
        case 18: return eq("proxy-authenticate") ? .proxyAuthenticate : .other
        case 19: return eq("proxy-authorization") ? .proxyAuthorization : .other
        default: return .other
        }
    }
}
