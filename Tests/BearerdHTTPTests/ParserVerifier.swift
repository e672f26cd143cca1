import Testing
@testable import BearerdHTTP

/// What a parse produced: the events (adjacent body slices concatenated) and, if parsing failed,
/// the error's reason, status and offset.
struct ParseOutcome: Equatable, CustomStringConvertible {
    var events: [HTTP1Event]
    var error: HTTP1Error?

    var description: String {
        var s = events.map { e -> String in
            switch e {
            case .requestHead(let h, let f): return "requestHead(\(h.method) \(h.target) \(h.version) \(h.headers.fields.map { "\($0.name)=\($0.value)" }), \(f))"
            case .responseHead(let h, let f): return "responseHead(\(h.status) \(h.reason) \(h.headers.fields.map { "\($0.name)=\($0.value)" }), \(f))"
            case .body(let b): return "body(\(String(decoding: b, as: UTF8.self)))"
            case .end(let t): return "end(\(t.map { "\($0.fields)" } ?? "nil"))"
            }
        }.joined(separator: ", ")
        if let error { s += " !! \(error)" }
        return s
    }

    var heads: [HTTP1Event] { events.filter { if case .body = $0 { return false }; if case .end = $0 { return false }; return true } }
    var bodies: [[UInt8]] { events.compactMap { if case .body(let b) = $0 { return Array(b) }; return nil } }
    var requestHeads: [HTTPRequestHead] { events.compactMap { if case .requestHead(let h, _) = $0 { return h }; return nil } }
    var responseHeads: [HTTPResponseHead] { events.compactMap { if case .responseHead(let h, _) = $0 { return h }; return nil } }
    var framings: [HTTP1BodyFraming] {
        events.compactMap {
            switch $0 {
            case .requestHead(_, let f), .responseHead(_, let f): return f
            default: return nil
            }
        }
    }
    var ends: [HTTPHeaders?] { events.compactMap { if case .end(let t) = $0 { return .some(t) }; return nil } }
}

/// Drives a parser over `chunks` the way a connection would: feed, then drain `next()` until nil.
/// Checks on the way that no body event is empty and that errors are sticky.
func runParser(_ chunks: [[UInt8]], role: HTTP1Parser.Role = .server, methods: [String] = [],
               eof: Bool = false, limits: HTTP1Limits = HTTP1Limits(), rawFeed: Bool = false) -> ParseOutcome {
    var parser = HTTP1Parser(role: role, limits: limits)
    for m in methods { parser.expectResponse(to: m) }
    var events: [HTTP1Event] = []

    func append(_ e: HTTP1Event) {
        if case .body(let b) = e {
            #expect(!b.isEmpty, "empty body event")
            if case .body(let prior)? = events.last {
                events[events.count - 1] = .body(ArraySlice(Array(prior) + Array(b)))
                return
            }
        }
        events.append(e)
    }
    func drain(_ parser: inout HTTP1Parser) -> HTTP1Error? {
        while true {
            do {
                guard let e = try parser.next() else { return nil }
                append(e)
            } catch {
                // After an error the parser is dead and rethrows the same error.
                do {
                    _ = try parser.next()
                    Issue.record("parser not dead after \(error)")
                } catch let again {
                    #expect(again == error)
                }
                return error
            }
        }
    }
    for chunk in chunks {
        if rawFeed {
            chunk.withUnsafeBytes { parser.feed($0) }
        } else {
            parser.feed(chunk)
        }
        if let e = drain(&parser) { return ParseOutcome(events: events, error: e) }
    }
    if eof {
        parser.feedEOF()
        if let e = drain(&parser) { return ParseOutcome(events: events, error: e) }
    }
    return ParseOutcome(events: events, error: nil)
}

/// In the spirit of swift-nio's ByteToMessageDecoderVerifier: parses `input` fed whole, byte by
/// byte, and split at every two-way split point; records an issue unless all outcomes agree.
/// Returns the outcome of the whole feed.
@discardableResult
func verify(_ input: [UInt8], role: HTTP1Parser.Role = .server, methods: [String] = [], eof: Bool = false,
            limits: HTTP1Limits = HTTP1Limits(), splits: Bool = true,
            sourceLocation: SourceLocation = #_sourceLocation) -> ParseOutcome {
    let whole = runParser([input], role: role, methods: methods, eof: eof, limits: limits)
    let bytewise = runParser(input.map { [$0] }, role: role, methods: methods, eof: eof, limits: limits, rawFeed: true)
    #expect(bytewise == whole, "byte by byte differs:\n  whole: \(whole)\n  bytes: \(bytewise)", sourceLocation: sourceLocation)
    if splits && input.count > 1 {
        for cut in 1..<input.count {
            let split = runParser([Array(input[..<cut]), Array(input[cut...])], role: role, methods: methods, eof: eof, limits: limits,
                                  rawFeed: cut % 2 == 0)
            if split != whole {
                Issue.record("split at \(cut) differs:\n  whole: \(whole)\n  split: \(split)", sourceLocation: sourceLocation)
                break
            }
        }
    }
    return whole
}

@discardableResult
func verify(_ input: String, role: HTTP1Parser.Role = .server, methods: [String] = [], eof: Bool = false,
            limits: HTTP1Limits = HTTP1Limits(), splits: Bool = true,
            sourceLocation: SourceLocation = #_sourceLocation) -> ParseOutcome {
    verify(Array(input.utf8), role: role, methods: methods, eof: eof, limits: limits, splits: splits, sourceLocation: sourceLocation)
}

/// Verifies and expects the parse to fail with `reason` (and `status` when given).
@discardableResult
func expectFailure(_ input: String, _ reason: String, status: Int? = nil, role: HTTP1Parser.Role = .server,
                   methods: [String] = [], eof: Bool = false, limits: HTTP1Limits = HTTP1Limits(),
                   sourceLocation: SourceLocation = #_sourceLocation) -> HTTP1Error? {
    let outcome = verify(input, role: role, methods: methods, eof: eof, limits: limits, sourceLocation: sourceLocation)
    #expect(outcome.error?.reason == reason, "expected \(reason), got \(outcome)", sourceLocation: sourceLocation)
    if let status {
        #expect(outcome.error?.status == status, "expected status \(status), got \(outcome)", sourceLocation: sourceLocation)
    }
    return outcome.error
}

/// Verifies and expects no error; returns the outcome.
@discardableResult
func expectSuccess(_ input: String, role: HTTP1Parser.Role = .server, methods: [String] = [], eof: Bool = false,
                   limits: HTTP1Limits = HTTP1Limits(), sourceLocation: SourceLocation = #_sourceLocation) -> ParseOutcome {
    let outcome = verify(input, role: role, methods: methods, eof: eof, limits: limits, sourceLocation: sourceLocation)
    #expect(outcome.error == nil, "unexpected error: \(outcome)", sourceLocation: sourceLocation)
    return outcome
}

func bytes(_ s: String) -> [UInt8] { Array(s.utf8) }

/// Headers from ordered pairs (duplicates allowed).
func hdrs(_ pairs: (String, String)...) -> HTTPHeaders { HTTPHeaders(pairs) }
