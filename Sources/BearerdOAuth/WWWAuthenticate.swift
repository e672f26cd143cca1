/// One challenge of a `WWW-Authenticate` field (RFC 9110 §11.6.1, §11.2).
public struct AuthenticationChallenge: Sendable, Equatable {
    /// As sent; compare case-insensitively (`isBearer`).
    public var scheme: String
    /// `token68` form, if the challenge used it.
    public var token68: String?
    /// auth-params, names lower-cased, quoted-strings unquoted, in order.
    public var parameters: [(name: String, value: String)]

    public init(scheme: String, token68: String? = nil, parameters: [(name: String, value: String)] = []) {
        self.scheme = scheme
        self.token68 = token68
        self.parameters = parameters
    }

    public var isBearer: Bool { scheme.lowercased() == "bearer" }

    /// The first parameter named `name` (case-insensitive).
    public func parameter(_ name: String) -> String? {
        let n = name.lowercased()
        return parameters.first { $0.name == n }?.value
    }

    public static func == (a: AuthenticationChallenge, b: AuthenticationChallenge) -> Bool {
        a.scheme == b.scheme && a.token68 == b.token68
            && a.parameters.elementsEqual(b.parameters, by: { $0.name == $1.name && $0.value == $1.value })
    }
}

/// Parser for `WWW-Authenticate` field values (RFC 9110 §11.6.1):
///
///     WWW-Authenticate = #challenge
///     challenge  = auth-scheme [ 1*SP ( token68 / #auth-param ) ]
///     auth-param = token BWS "=" BWS ( token / quoted-string )
///     token68    = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
///
/// Several challenges may share one field, separated by commas like the params; a list item
/// that is `token` not followed by `=` starts a new challenge. RFC 6750 §3 Bearer params
/// (`realm`, `scope`, `error`, `error_description`, `error_uri`) come out as auth-params.
public enum WWWAuthenticate {
    /// Why a value could not be parsed, with the byte offset.
    public struct ParseError: Error, Sendable, Equatable {
        /// `www_authenticate.expected_scheme`, `.expected_value`, `.unterminated_quote`,
        /// `.unexpected_character`, `.duplicate_parameter`.
        public let reason: String
        public let offset: Int
    }

    /// All challenges of all given field values, in order.
    public static func parse(_ values: [String]) throws(ParseError) -> [AuthenticationChallenge] {
        var all: [AuthenticationChallenge] = []
        for v in values { all += try parse(v) }
        return all
    }

    public static func parse(_ value: String) throws(ParseError) -> [AuthenticationChallenge] {
        var p = Parser(b: Array(value.utf8))
        return try p.challenges()
    }

    private struct Parser {
        let b: [UInt8]
        var i = 0

        static func isTchar(_ c: UInt8) -> Bool {
            switch c {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                return true
            default:
                return Array("!#$%&'*+-.^_`|~".utf8).contains(c)
            }
        }
        static func isToken68Char(_ c: UInt8) -> Bool {
            switch c {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                 UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"), UInt8(ascii: "+"), UInt8(ascii: "/"):
                return true
            default: return false
            }
        }

        var atEnd: Bool { i >= b.count }

        mutating func skipOWS() { while i < b.count, b[i] == 0x20 || b[i] == 0x09 { i += 1 } }

        /// Skips OWS and empty list elements (RFC 9110 §5.6.1 allows them).
        mutating func skipSeparators() {
            while i < b.count, b[i] == 0x20 || b[i] == 0x09 || b[i] == UInt8(ascii: ",") { i += 1 }
        }

        mutating func token() -> String? {
            let start = i
            while i < b.count, Parser.isTchar(b[i]) { i += 1 }
            return i > start ? String(decoding: b[start..<i], as: UTF8.self) : nil
        }

        mutating func quoted() throws(ParseError) -> String {
            let open = i
            i += 1
            var out: [UInt8] = []
            while i < b.count {
                let c = b[i]
                if c == UInt8(ascii: "\"") { i += 1; return String(decoding: out, as: UTF8.self) }
                if c == UInt8(ascii: "\\") {
                    guard i + 1 < b.count else { break }
                    out.append(b[i + 1]); i += 2; continue
                }
                guard c == 0x09 || (c >= 0x20 && c != 0x7F) else {
                    throw ParseError(reason: "www_authenticate.unexpected_character", offset: i)
                }
                out.append(c); i += 1
            }
            throw ParseError(reason: "www_authenticate.unterminated_quote", offset: open)
        }

        /// Looks ahead: does an auth-param (`token BWS "="` not followed by more `=` or the
        /// end of a token68) start at `i`?
        func authParamAhead() -> Bool {
            var j = i
            while j < b.count, Parser.isTchar(b[j]) { j += 1 }
            guard j > i else { return false }
            while j < b.count, b[j] == 0x20 || b[j] == 0x09 { j += 1 }
            guard j < b.count, b[j] == UInt8(ascii: "=") else { return false }
            j += 1
            // `abc==` or `abc=` followed by end/comma is a token68 ending in padding.
            while j < b.count, b[j] == 0x20 || b[j] == 0x09 { j += 1 }
            return j < b.count && b[j] != UInt8(ascii: "=") && b[j] != UInt8(ascii: ",")
        }

        mutating func challenges() throws(ParseError) -> [AuthenticationChallenge] {
            var result: [AuthenticationChallenge] = []
            skipSeparators()
            while !atEnd {
                guard let scheme = token() else { throw ParseError(reason: "www_authenticate.expected_scheme", offset: i) }
                var challenge = AuthenticationChallenge(scheme: scheme)
                let afterScheme = i
                skipOWS()
                if atEnd || b[i] == UInt8(ascii: ",") {
                    result.append(challenge); skipSeparators(); continue
                }
                guard i > afterScheme else { throw ParseError(reason: "www_authenticate.unexpected_character", offset: i) }
                if authParamAhead() {
                    try params(into: &challenge)
                } else {
                    let start = i
                    while i < b.count, Parser.isToken68Char(b[i]) { i += 1 }
                    guard i > start else { throw ParseError(reason: "www_authenticate.expected_value", offset: i) }
                    while i < b.count, b[i] == UInt8(ascii: "=") { i += 1 }
                    challenge.token68 = String(decoding: b[start..<i], as: UTF8.self)
                    skipOWS()
                    guard atEnd || b[i] == UInt8(ascii: ",") else {
                        throw ParseError(reason: "www_authenticate.unexpected_character", offset: i)
                    }
                }
                result.append(challenge)
                skipSeparators()
            }
            return result
        }

        mutating func params(into challenge: inout AuthenticationChallenge) throws(ParseError) {
            while true {
                let nameOffset = i
                guard let name = token() else { throw ParseError(reason: "www_authenticate.expected_value", offset: i) }
                skipOWS()
                guard !atEnd, b[i] == UInt8(ascii: "=") else { throw ParseError(reason: "www_authenticate.expected_value", offset: i) }
                i += 1
                skipOWS()
                guard !atEnd else { throw ParseError(reason: "www_authenticate.expected_value", offset: i) }
                let value: String
                if b[i] == UInt8(ascii: "\"") {
                    value = try quoted()
                } else if let t = token() {
                    value = t
                } else {
                    throw ParseError(reason: "www_authenticate.expected_value", offset: i)
                }
                let lower = name.lowercased()
                guard challenge.parameter(lower) == nil else {
                    throw ParseError(reason: "www_authenticate.duplicate_parameter", offset: nameOffset)
                }
                challenge.parameters.append((lower, value))
                skipOWS()
                if atEnd { return }
                guard b[i] == UInt8(ascii: ",") else {
                    throw ParseError(reason: "www_authenticate.unexpected_character", offset: i)
                }
                skipSeparators()
                if atEnd || !authParamAhead() { return }
            }
        }
    }
}
