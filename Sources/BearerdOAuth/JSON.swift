/// A parsed JSON value (RFC 8259). Objects keep their members in a dictionary; the strict
/// parser refuses duplicate names, so no member is silently dropped.
public enum JSONValue: Sendable, Equatable {
    case object([String: JSONValue])
    case array([JSONValue])
    case string(String)
    /// The number's literal text as it appeared (RFC 8259 §6 grammar), so integers are never
    /// rounded through a `Double`.
    case number(String)
    case bool(Bool)
    case null

    public subscript(key: String) -> JSONValue? {
        if case .object(let members) = self { return members[key] }
        return nil
    }

    public var stringValue: String? { if case .string(let s) = self { return s }; return nil }
    public var objectValue: [String: JSONValue]? { if case .object(let o) = self { return o }; return nil }

    /// The value as an `Int64` if it is an integer literal that fits (no fraction, no exponent).
    public var int64Value: Int64? {
        if case .number(let text) = self { return Int64(text) }
        return nil
    }

    /// The value as a `Double` if it is a number.
    public var doubleValue: Double? {
        if case .number(let text) = self { return Double(text) }
        return nil
    }
}

/// Why a JSON text was refused, with the byte offset where it went wrong.
public struct JSONError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Stable dotted reason, e.g. `json.trailing_data`.
    public let reason: String
    public let offset: Int
    public var description: String { "\(reason) at byte \(offset)" }
}

/// A strict RFC 8259 parser: one value, surrounded only by JSON whitespace; no comments, no
/// trailing commas, no leading zeros, no lone surrogates, no control characters in strings,
/// valid UTF-8 only, no duplicate object names. Nesting depth and input size are bounded.
public struct JSONParser: Sendable {
    public var maxDepth: Int
    public var maxBytes: Int

    /// Defaults: depth 64, 1 MiB (the largest token response bearerd accepts, docs/architecture.md §6).
    public init(maxDepth: Int = 64, maxBytes: Int = 1 << 20) {
        self.maxDepth = maxDepth
        self.maxBytes = maxBytes
    }

    public func parse(_ bytes: [UInt8]) throws(JSONError) -> JSONValue {
        guard bytes.count <= maxBytes else { throw JSONError(reason: "json.too_large", offset: maxBytes) }
        var cursor = Cursor(bytes: bytes, maxDepth: maxDepth)
        cursor.skipWhitespace()
        let value = try cursor.parseValue(depth: 0)
        cursor.skipWhitespace()
        guard cursor.index == bytes.count else { throw JSONError(reason: "json.trailing_data", offset: cursor.index) }
        return value
    }

    public func parse(_ text: String) throws(JSONError) -> JSONValue {
        try parse(Array(text.utf8))
    }

    private struct Cursor {
        let bytes: [UInt8]
        let maxDepth: Int
        var index = 0

        init(bytes: [UInt8], maxDepth: Int) { self.bytes = bytes; self.maxDepth = maxDepth }

        func fail(_ reason: String, at offset: Int? = nil) -> JSONError {
            JSONError(reason: reason, offset: offset ?? index)
        }

        mutating func skipWhitespace() {
            while index < bytes.count {
                switch bytes[index] {
                case 0x20, 0x09, 0x0A, 0x0D: index += 1
                default: return
                }
            }
        }

        mutating func parseValue(depth: Int) throws(JSONError) -> JSONValue {
            guard index < bytes.count else { throw fail("json.unexpected_end") }
            switch bytes[index] {
            case UInt8(ascii: "{"): return try parseObject(depth: depth + 1)
            case UInt8(ascii: "["): return try parseArray(depth: depth + 1)
            case UInt8(ascii: "\""): return .string(try parseString())
            case UInt8(ascii: "t"): try literal("true"); return .bool(true)
            case UInt8(ascii: "f"): try literal("false"); return .bool(false)
            case UInt8(ascii: "n"): try literal("null"); return .null
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try parseNumber()
            default: throw fail("json.unexpected_character")
            }
        }

        mutating func literal(_ word: String) throws(JSONError) {
            for b in word.utf8 {
                guard index < bytes.count, bytes[index] == b else { throw fail("json.invalid_literal") }
                index += 1
            }
        }

        mutating func parseObject(depth: Int) throws(JSONError) -> JSONValue {
            guard depth <= maxDepth else { throw fail("json.too_deep") }
            index += 1
            var members: [String: JSONValue] = [:]
            skipWhitespace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "}") { index += 1; return .object(members) }
            while true {
                skipWhitespace()
                guard index < bytes.count else { throw fail("json.unexpected_end") }
                guard bytes[index] == UInt8(ascii: "\"") else { throw fail("json.expected_name") }
                let nameOffset = index
                let name = try parseString()
                skipWhitespace()
                guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw fail("json.expected_colon") }
                index += 1
                skipWhitespace()
                let value = try parseValue(depth: depth)
                guard members.updateValue(value, forKey: name) == nil else {
                    throw fail("json.duplicate_name", at: nameOffset)
                }
                skipWhitespace()
                guard index < bytes.count else { throw fail("json.unexpected_end") }
                if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
                if bytes[index] == UInt8(ascii: "}") { index += 1; return .object(members) }
                throw fail("json.expected_comma_or_end")
            }
        }

        mutating func parseArray(depth: Int) throws(JSONError) -> JSONValue {
            guard depth <= maxDepth else { throw fail("json.too_deep") }
            index += 1
            var elements: [JSONValue] = []
            skipWhitespace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "]") { index += 1; return .array(elements) }
            while true {
                skipWhitespace()
                elements.append(try parseValue(depth: depth))
                skipWhitespace()
                guard index < bytes.count else { throw fail("json.unexpected_end") }
                if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
                if bytes[index] == UInt8(ascii: "]") { index += 1; return .array(elements) }
                throw fail("json.expected_comma_or_end")
            }
        }

        mutating func parseNumber() throws(JSONError) -> JSONValue {
            let start = index
            func isDigit(_ b: UInt8) -> Bool { b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9") }
            if bytes[index] == UInt8(ascii: "-") { index += 1 }
            guard index < bytes.count, isDigit(bytes[index]) else { throw fail("json.invalid_number") }
            if bytes[index] == UInt8(ascii: "0") {
                index += 1
                if index < bytes.count, isDigit(bytes[index]) { throw fail("json.leading_zero") }
            } else {
                while index < bytes.count, isDigit(bytes[index]) { index += 1 }
            }
            if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
                index += 1
                guard index < bytes.count, isDigit(bytes[index]) else { throw fail("json.invalid_number") }
                while index < bytes.count, isDigit(bytes[index]) { index += 1 }
            }
            if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
                index += 1
                if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
                guard index < bytes.count, isDigit(bytes[index]) else { throw fail("json.invalid_number") }
                while index < bytes.count, isDigit(bytes[index]) { index += 1 }
            }
            return .number(String(decoding: bytes[start..<index], as: UTF8.self))
        }

        mutating func hex4() throws(JSONError) -> UInt32 {
            guard index + 4 <= bytes.count else { throw fail("json.invalid_escape") }
            var v: UInt32 = 0
            for _ in 0..<4 {
                let c = bytes[index]
                let d: UInt32
                switch c {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): d = UInt32(c - UInt8(ascii: "0"))
                case UInt8(ascii: "a")...UInt8(ascii: "f"): d = UInt32(c - UInt8(ascii: "a")) + 10
                case UInt8(ascii: "A")...UInt8(ascii: "F"): d = UInt32(c - UInt8(ascii: "A")) + 10
                default: throw fail("json.invalid_escape")
                }
                v = v << 4 | d
                index += 1
            }
            return v
        }

        mutating func parseString() throws(JSONError) -> String {
            let open = index
            index += 1
            var out: [UInt8] = []
            var runStart = index
            while true {
                guard index < bytes.count else { throw fail("json.unterminated_string", at: open) }
                let b = bytes[index]
                if b == UInt8(ascii: "\"") {
                    out.append(contentsOf: bytes[runStart..<index])
                    index += 1
                    break
                }
                if b < 0x20 { throw fail("json.control_character") }
                if b != UInt8(ascii: "\\") { index += 1; continue }
                out.append(contentsOf: bytes[runStart..<index])
                let escapeOffset = index
                index += 1
                guard index < bytes.count else { throw fail("json.unterminated_string", at: open) }
                let e = bytes[index]
                index += 1
                switch e {
                case UInt8(ascii: "\""): out.append(0x22)
                case UInt8(ascii: "\\"): out.append(0x5C)
                case UInt8(ascii: "/"): out.append(0x2F)
                case UInt8(ascii: "b"): out.append(0x08)
                case UInt8(ascii: "f"): out.append(0x0C)
                case UInt8(ascii: "n"): out.append(0x0A)
                case UInt8(ascii: "r"): out.append(0x0D)
                case UInt8(ascii: "t"): out.append(0x09)
                case UInt8(ascii: "u"):
                    var scalar = try hex4()
                    if scalar >= 0xD800 && scalar <= 0xDBFF {
                        guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u") else {
                            throw fail("json.lone_surrogate", at: escapeOffset)
                        }
                        index += 2
                        let low = try hex4()
                        guard low >= 0xDC00 && low <= 0xDFFF else { throw fail("json.lone_surrogate", at: escapeOffset) }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    } else if scalar >= 0xDC00 && scalar <= 0xDFFF {
                        throw fail("json.lone_surrogate", at: escapeOffset)
                    }
                    // Valid by construction: surrogates were combined or refused above.
                    out.append(contentsOf: String(Character(Unicode.Scalar(scalar)!)).utf8)
                default:
                    throw fail("json.invalid_escape", at: escapeOffset)
                }
                runStart = index
            }
            guard let s = String(validating: out, as: UTF8.self) else { throw fail("json.invalid_utf8", at: open) }
            return s
        }
    }
}

/// Minimal JSON writer for the persisted state (object of strings, integers and nulls) and
/// for the JSON bodies and log lines the shell writes.
public enum JSONWriter {
    /// `s` as a JSON string literal (RFC 8259 §7), quotes included.
    public static func quote(_ s: String) -> String {
        var out = "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            default:
                if scalar.value < 0x20 {
                    let hex = Array("0123456789abcdef")
                    out += "\\u00" + String(hex[Int(scalar.value >> 4)]) + String(hex[Int(scalar.value & 0xf)])
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out + "\""
    }
}
