// RESP2, the Redis serialization protocol (https://redis.io/docs/latest/develop/reference/protocol-spec/),
// as far as the shared token cache (docs/architecture.md §6.13) needs it: commands are arrays of
// bulk strings; replies are parsed incrementally from bytes with hard bounds. Pure: imports
// nothing (fuzzed by Tests/Fuzz/RESPFuzz.swift).

/// One RESP2 reply.
public enum RESPValue: Equatable, Sendable {
    /// `+OK\r\n`
    case simple(String)
    /// `-ERR message\r\n`
    case error(String)
    /// `:42\r\n`
    case integer(Int64)
    /// `$3\r\nabc\r\n`; nil for the null bulk string `$-1\r\n`.
    case bulk([UInt8]?)
    /// `*2\r\n…`; nil for the null array `*-1\r\n`.
    case array([RESPValue]?)

    /// The bytes of a bulk or simple string, nil otherwise (a null bulk included).
    public var bytes: [UInt8]? {
        switch self {
        case .bulk(let b): return b
        case .simple(let s): return Array(s.utf8)
        default: return nil
        }
    }
}

/// Why a reply stream cannot be parsed; the connection that carried it must be closed (the
/// replies that follow can no longer be matched to their commands).
public struct RESPError: Error, Equatable, Sendable, CustomStringConvertible {
    public let reason: String
    public init(_ reason: String) { self.reason = reason }
    public var description: String { reason }
}

/// The bounds a reply must stay within (a misbehaving or hostile server must not make bearerd
/// allocate without limit, recurse without limit, or trap).
public struct RESPLimits: Sendable, Equatable {
    /// Largest bulk string (a sealed token record is far smaller).
    public var maxBulkBytes: Int = 1 << 20
    /// Most elements of one array.
    public var maxArrayLength: Int = 1024
    /// Deepest nesting of arrays (1: a flat array).
    public var maxDepth: Int = 8
    /// Longest line of a simple string, error or length header, CRLF excluded.
    public var maxLineBytes: Int = 4096
    /// Most bytes one complete reply may span (the sum of its parts).
    public var maxReplyBytes: Int = 2 << 20
    public init() {}
}

/// Encodes commands (RESP2 arrays of bulk strings).
public enum RESP {
    /// `*N\r\n$len\r\narg\r\n…` for the arguments given.
    public static func command(_ arguments: [[UInt8]]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(16 + arguments.reduce(0) { $0 &+ $1.count &+ 16 })
        out.append(0x2A)  // *
        appendDecimal(arguments.count, to: &out)
        for a in arguments {
            out.append(0x24)  // $
            appendDecimal(a.count, to: &out)
            out.append(contentsOf: a)
            out.append(0x0D)
            out.append(0x0A)
        }
        return out
    }

    /// `command(_:)` of UTF-8 strings.
    public static func command(_ arguments: [String]) -> [UInt8] {
        command(arguments.map { Array($0.utf8) })
    }

    private static func appendDecimal(_ n: Int, to out: inout [UInt8]) {
        var digits: [UInt8] = []
        var v = n.magnitude
        repeat {
            digits.append(UInt8(truncatingIfNeeded: 0x30 &+ v % 10))
            v /= 10
        } while v > 0
        if n < 0 { out.append(0x2D) }
        out.append(contentsOf: digits.reversed())
        out.append(0x0D)
        out.append(0x0A)
    }
}

/// Incremental RESP2 reply parser: feed bytes as they arrive, take complete replies with
/// `next()`. Owns its buffer; a value type used by one connection on one queue.
///
/// Invariants: `start ≤ buffer.count`; bytes before `start` are consumed replies; an error is
/// sticky (every later `next()` throws it again), since the stream has lost its framing.
public struct RESPParser: Sendable {
    public let limits: RESPLimits
    private var buffer: [UInt8] = []
    private var start = 0
    private var failure: RESPError?

    public init(limits: RESPLimits = RESPLimits()) {
        self.limits = limits
    }

    /// Bytes received but not yet part of a complete reply.
    public var pendingByteCount: Int { buffer.count - start }

    public mutating func feed(_ bytes: UnsafeRawBufferPointer) {
        buffer.append(contentsOf: bytes)
    }

    public mutating func feed(_ bytes: [UInt8]) {
        buffer.append(contentsOf: bytes)
    }

    /// The next complete reply, nil when more bytes are needed.
    public mutating func next() throws(RESPError) -> RESPValue? {
        if let failure { throw failure }
        do throws(RESPError) {
            var position = start
            guard let value = try parseValue(at: &position, depth: 1) else {
                if buffer.count - start > limits.maxReplyBytes { throw RESPError("resp.reply_too_large") }
                return nil
            }
            start = position
            compact()
            return value
        } catch {
            failure = error
            throw error
        }
    }

    private mutating func compact() {
        if start == buffer.count {
            buffer.removeAll(keepingCapacity: buffer.capacity <= 64 * 1024)
            start = 0
        } else if start > 64 * 1024 && start > buffer.count / 2 {
            buffer.removeSubrange(0..<start)
            start = 0
        }
    }

    /// Parses the value at `position` (advanced past it on success); nil if incomplete.
    private func parseValue(at position: inout Int, depth: Int) throws(RESPError) -> RESPValue? {
        guard position < buffer.count else { return nil }
        if position - start > limits.maxReplyBytes { throw RESPError("resp.reply_too_large") }
        let type = buffer[position]
        var p = position + 1
        guard let line = try readLine(at: &p) else { return nil }
        switch type {
        case 0x2B:  // +
            position = p
            return .simple(String(decoding: buffer[line], as: UTF8.self))
        case 0x2D:  // -
            position = p
            return .error(String(decoding: buffer[line], as: UTF8.self))
        case 0x3A:  // :
            position = p
            return .integer(try integer(line))
        case 0x24:  // $
            let length = try integer(line)
            if length == -1 {
                position = p
                return .bulk(nil)
            }
            guard length >= 0 else { throw RESPError("resp.bad_bulk_length") }
            guard length <= Int64(limits.maxBulkBytes) else { throw RESPError("resp.bulk_too_large") }
            let n = Int(length)
            // The body and its CRLF.
            guard buffer.count - p >= n + 2 else { return nil }
            guard buffer[p + n] == 0x0D, buffer[p + n + 1] == 0x0A else { throw RESPError("resp.bad_bulk_terminator") }
            position = p + n + 2
            return .bulk(Array(buffer[p..<(p + n)]))
        case 0x2A:  // *
            let length = try integer(line)
            if length == -1 {
                position = p
                return .array(nil)
            }
            guard length >= 0 else { throw RESPError("resp.bad_array_length") }
            guard length <= Int64(limits.maxArrayLength) else { throw RESPError("resp.array_too_long") }
            guard depth < limits.maxDepth || length == 0 else { throw RESPError("resp.too_deep") }
            var elements: [RESPValue] = []
            elements.reserveCapacity(Int(min(length, 64)))
            for _ in 0..<Int(length) {
                guard let element = try parseValue(at: &p, depth: depth + 1) else { return nil }
                elements.append(element)
            }
            position = p
            return .array(elements)
        default:
            throw RESPError("resp.unknown_type")
        }
    }

    /// The range of the line at `position` up to its CRLF (advanced past the CRLF); nil if the
    /// CRLF has not arrived yet. A bare CR or LF inside the line is an error.
    private func readLine(at position: inout Int) throws(RESPError) -> Range<Int>? {
        var i = position
        let end = buffer.count
        while i < end {
            let b = buffer[i]
            if b == 0x0D {
                guard i + 1 < end else { return nil }
                guard buffer[i + 1] == 0x0A else { throw RESPError("resp.bare_cr") }
                let range = position..<i
                position = i + 2
                return range
            }
            if b == 0x0A { throw RESPError("resp.bare_lf") }
            if i - position >= limits.maxLineBytes { throw RESPError("resp.line_too_long") }
            i += 1
        }
        if end - position > limits.maxLineBytes { throw RESPError("resp.line_too_long") }
        return nil
    }

    /// A decimal integer with an optional `-`, checked (overflow is an error, never a trap).
    private func integer(_ range: Range<Int>) throws(RESPError) -> Int64 {
        var i = range.lowerBound
        var negative = false
        if i < range.upperBound, buffer[i] == 0x2D {
            negative = true
            i += 1
        }
        guard i < range.upperBound else { throw RESPError("resp.bad_integer") }
        var value: Int64 = 0
        while i < range.upperBound {
            let b = buffer[i]
            guard b >= 0x30, b <= 0x39 else { throw RESPError("resp.bad_integer") }
            let digit = Int64(b - 0x30)
            let (m, o1) = value.multipliedReportingOverflow(by: 10)
            let (s, o2) = negative ? m.subtractingReportingOverflow(digit) : m.addingReportingOverflow(digit)
            guard !o1, !o2 else { throw RESPError("resp.bad_integer") }
            value = s
            i += 1
        }
        return value
    }
}
