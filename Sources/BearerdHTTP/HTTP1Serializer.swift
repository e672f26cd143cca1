/// Writes HTTP/1.1 message heads and chunked framing (RFC 9112 §3, §4, §5, §7.1) into a caller's
/// buffer. Stateless. Field names and values are written byte-exact as given; callers must only
/// pass heads that satisfy the field grammar (the parser guarantees it for received ones).
public enum HTTP1Serializer {
    /// `method SP target SP HTTP/x.y CRLF *(field CRLF) CRLF`
    /// `setting`: a field written as `HTTPHeaders.set` would leave it (in place of the first field
    /// of that name, under `setting`'s spelling, the others dropped, or last), without copying
    /// the head to change it.
    public static func writeRequestHead(_ head: HTTPRequestHead, setting: HTTPField? = nil, into buffer: inout [UInt8]) {
        let extra = setting.map { $0.name.utf8.count + $0.value.utf8.count + 4 } ?? 0
        let estimate = head.method.utf8.count + head.target.utf8.count + 12 + fieldsSize(head.headers) + extra + 2
        buffer.appendingHead(estimate: estimate) { c in
            c.put(head.method)
            c.put(asciiSP)
            c.put(head.target)
            c.put(asciiSP)
            putVersion(head.version, into: &c)
            c.putCRLF()
            // Fields by address, not copied out of the array (a copy retains and releases both strings).
            head.headers.fields.withUnsafeBufferPointer { fields in
                if let setting {
                    var written = false
                    for i in fields.indices {
                        // Equal names have equal kinds (`KnownField` ignores case): most fields
                        // are told apart by one byte, not a name comparison.
                        if fields[i].known == setting.known && asciiCaseInsensitiveEquals(fields[i].name, setting.name) {
                            if !written { putField(setting, into: &c) }
                            written = true
                        } else {
                            putField(fields[i], into: &c)
                        }
                    }
                    if !written { putField(setting, into: &c) }
                } else {
                    for i in fields.indices { putField(fields[i], into: &c) }
                }
            }
            c.putCRLF()
        }
    }

    /// `HTTP/x.y SP 3DIGIT SP reason CRLF *(field CRLF) CRLF` (the SP before an empty reason is
    /// kept, as RFC 9112 §4 requires).
    public static func writeResponseHead(_ head: HTTPResponseHead, into buffer: inout [UInt8]) {
        buffer.appendingHead(estimate: 15 + head.reason.utf8.count + fieldsSize(head.headers) + 2) { c in
            putStatusLine(status: head.status, reason: head.reason, version: head.version, into: &c)
            putFields(head.headers, into: &c)
            c.putCRLF()
        }
    }

    /// `HTTP/x.y SP 3DIGIT SP reason CRLF`.
    @inlinable
    public static func putStatusLine(status: Int, reason: String, version: HTTPVersion, into c: inout ByteCursor) {
        putVersion(version, into: &c)
        c.put(asciiSP)
        let status = min(max(status, 0), 999)
        c.put(UInt8(0x30 + status / 100))
        c.put(UInt8(0x30 + (status / 10) % 10))
        c.put(UInt8(0x30 + status % 10))
        c.put(asciiSP)
        c.put(reason)
        c.putCRLF()
    }

    @inlinable @inline(__always)
    static func putVersion(_ version: HTTPVersion, into c: inout ByteCursor) {
        c.put("HTTP/" as StaticString)
        c.put(UInt8(0x30 + min(max(version.major, 0), 9)))
        c.put(UInt8(ascii: "."))
        c.put(UInt8(0x30 + min(max(version.minor, 0), 9)))
    }

    /// `name: value CRLF`.
    @inlinable @inline(__always)
    public static func putField(_ field: HTTPField, into c: inout ByteCursor) {
        c.put(field.name)
        c.put(UInt8(ascii: ":"))
        c.put(asciiSP)
        c.put(field.value)
        c.putCRLF()
    }

    /// One chunk: `<hex size> CRLF <data> CRLF`; nothing for empty input (an empty chunk would be
    /// the last-chunk).
    public static func writeChunk(_ bytes: UnsafeRawBufferPointer, into buffer: inout [UInt8]) {
        guard bytes.count > 0 else { return }
        buffer.reserveCapacity(buffer.count + 16 + 4 + bytes.count)
        writeHex(UInt64(bytes.count), into: &buffer)
        buffer.append(asciiCR)
        buffer.append(asciiLF)
        buffer.append(contentsOf: bytes)
        buffer.append(asciiCR)
        buffer.append(asciiLF)
    }

    /// The last-chunk, the trailer section (if any) and the final CRLF: `0 CRLF *(field CRLF) CRLF`.
    public static func writeLastChunk(trailers: HTTPHeaders?, into buffer: inout [UInt8]) {
        buffer.append(UInt8(ascii: "0"))
        buffer.append(asciiCR)
        buffer.append(asciiLF)
        if let trailers {
            buffer.appendingHead(estimate: fieldsSize(trailers)) { c in
                putFields(trailers, into: &c)
            }
        }
        buffer.append(asciiCR)
        buffer.append(asciiLF)
    }

    /// `putField` for every field, in order, read in place (no copy of a field).
    @inlinable
    public static func putFields(_ headers: HTTPHeaders, into c: inout ByteCursor) {
        headers.fields.withUnsafeBufferPointer { fields in
            for i in fields.indices { putField(fields[i], into: &c) }
        }
    }

    /// Bytes `putField` writes for all of `headers`.
    public static func fieldsSize(_ headers: HTTPHeaders) -> Int {
        headers.fields.withUnsafeBufferPointer { fields in
            var n = 0
            for i in fields.indices { n += fields[i].name.utf8.count + fields[i].value.utf8.count + 4 }
            return n
        }
    }

    static func writeHex(_ value: UInt64, into buffer: inout [UInt8]) {
        let digits: StaticString = "0123456789abcdef"
        var shift = (64 - value.leadingZeroBitCount + 3) / 4 * 4
        if shift == 0 { shift = 4 }
        while shift > 0 {
            shift -= 4
            buffer.append(digits.utf8Start[Int((value >> UInt64(shift)) & 0xF)])
        }
    }
}

/// Header rules of RFC 9110 §7.6.1 and RFC 9112 §9 (connection management). Stateless.
public enum HTTPHeaderRules {
    /// Removes hop-by-hop fields (`KnownField.isHopByHop`) and every field named in a
    /// `Connection` field (RFC 9110 §7.6.1). Leaves `headers` untouched (no copy) when none is there.
    public static func removeHopByHop(_ headers: inout HTTPHeaders) {
        var hopByHop = false, connection = false
        for i in headers.fields.indices {
            let kind = headers.fields[i].known
            guard kind.isHopByHop else { continue }
            hopByHop = true
            if kind == .connection {
                connection = true
                break
            }
        }
        guard hopByHop else { return }
        let named = connection ? connectionOptions(headers) : ConnectionOptions()
        headers.fields.removeAll { field in field.known.isHopByHop || named.names(field) }
    }

    /// The non-empty elements of every `name` field's comma-separated list (RFC 9110 §5.6.1),
    /// OWS-trimmed, in order.
    public static func listValues(_ headers: HTTPHeaders, _ name: String) -> [String] {
        var out: [String] = []
        for field in headers.fields where asciiCaseInsensitiveEquals(field.name, name) {
            for element in HTTP1Syntax.listElements(field.value.utf8) where !element.isEmpty {
                out.append(String(decoding: element, as: UTF8.self))
            }
        }
        return out
    }

    /// The lowercased connection options of all `Connection` fields (RFC 9110 §7.6.1), empty list
    /// elements dropped, in order.
    public static func connectionTokens(_ headers: HTTPHeaders) -> [String] {
        var tokens: [String] = []
        for field in headers.fields where field.known == .connection {
            for element in HTTP1Syntax.listElements(field.value.utf8) where !element.isEmpty {
                let lowered = element.map { $0 >= 0x41 && $0 <= 0x5A ? $0 | 0x20 : $0 }
                tokens.append(String(decoding: lowered, as: UTF8.self))
            }
        }
        return tokens
    }

    /// What the `Connection` fields of a message say (RFC 9110 §7.6.1). Read without allocating
    /// unless they name options other than `close`, `keep-alive` and `upgrade`.
    public struct ConnectionOptions: Sendable, Equatable {
        /// Whether any `Connection` field was there.
        public var present = false
        public var close = false
        public var keepAlive = false
        public var upgrade = false
        /// The other options, lowercased, in order.
        public var others: [String] = []

        public init() {}

        /// Whether the field `name` is one the `Connection` fields name (so hop-by-hop).
        public func names(_ name: String) -> Bool {
            names(HTTPField(name: name, value: ""))
        }

        /// Whether `field` is one the `Connection` fields name, its kind standing in for two of
        /// the name comparisons (`KnownField` tells `keep-alive` and `upgrade` apart exactly): a
        /// response that says `Connection: keep-alive` costs no name comparison per field.
        @inline(__always)
        public func names(_ field: HTTPField) -> Bool {
            guard present else { return false }
            if keepAlive && field.known == .keepAlive { return true }
            if upgrade && field.known == .upgrade { return true }
            if close && asciiCaseInsensitiveEquals(field.name, "close") { return true }
            return !others.isEmpty && others.contains { asciiCaseInsensitiveEquals(field.name, $0) }
        }
    }

    public static func connectionOptions(_ headers: HTTPHeaders) -> ConnectionOptions {
        var options = ConnectionOptions()
        guard headers.contains(.connection) else { return options }  // most messages: no copy of any field
        // By index: only the `Connection` fields' values are copied out, not every field.
        for i in headers.fields.indices where headers.fields[i].known == .connection {
            options.present = true
            // The usual whole values, compared as they are (the parser trimmed the OWS).
            let v = headers.fields[i].value
            if v == "keep-alive" {
                options.keepAlive = true
                continue
            }
            if v == "close" {
                options.close = true
                continue
            }
            var value = v
            value.withUTF8 { b in
                var start = 0
                var i = 0
                while i <= b.count {
                    if i == b.count || b[i] == UInt8(ascii: ",") {
                        var lo = start, hi = i
                        while lo < hi && HTTP1Syntax.isOWS(b[lo]) { lo += 1 }
                        while hi > lo && HTTP1Syntax.isOWS(b[hi - 1]) { hi -= 1 }
                        let element = UnsafeBufferPointer(rebasing: b[lo..<hi])
                        if element.isEmpty {
                        } else if HTTP1Syntax.equalsLowercase(element, "close") {
                            options.close = true
                        } else if HTTP1Syntax.equalsLowercase(element, "keep-alive") {
                            options.keepAlive = true
                        } else if HTTP1Syntax.equalsLowercase(element, "upgrade") {
                            options.upgrade = true
                        } else {
                            options.others.append(String(decoding: element.map { $0 >= 0x41 && $0 <= 0x5A ? $0 | 0x20 : $0 }, as: UTF8.self))
                        }
                        start = i + 1
                    }
                    i += 1
                }
            }
        }
        return options
    }

    /// RFC 9112 §9.3: HTTP/1.1 (and later) connections persist unless `close` is given; HTTP/1.0
    /// ones only with `keep-alive` (and no `close`).
    public static func keepAlive(version: HTTPVersion, headers: HTTPHeaders) -> Bool {
        let modern = version.major > 1 || (version.major == 1 && version.minor >= 1)
        let options = connectionOptions(headers)
        if options.close { return false }
        return modern || options.keepAlive
    }

    /// RFC 9110 §10.1.1: the request carries `Expect: 100-continue` (case-insensitive).
    public static func expectsContinue(_ head: HTTPRequestHead) -> Bool {
        guard head.headers.contains(.expect) else { return false }
        for value in head.headers.values("expect") {
            for element in HTTP1Syntax.listElements(value.utf8) where HTTP1Syntax.equalsLowercase(element, "100-continue") {
                return true
            }
        }
        return false
    }
}
