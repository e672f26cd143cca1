// libFuzzer entry for the HTTP/1.1 parser (compiled by Tests/Fuzz/run.sh together with
// Sources/BearerdHTTP, not by SwiftPM). The first byte picks the role and a split point; the
// rest is the byte stream. Oracle: no crash, and the same events or the same error whether the
// stream arrives whole, in two pieces, or with body bytes relayed by the caller where the parser
// allows it (`directBodyLimit`/`consumeBody`, framing fed a few bytes at a time: what the
// upstream connection does), the property the unit tests check on known inputs; and the same
// with a field-line cache shared by every input (as a loop's connections share one), which
// holds lines of earlier inputs on the first run and this input's own on the second.

/// Events with adjacent body pieces merged (as bytes: a split may cut a UTF-8 sequence), so
/// different splits compare equal.
struct Outcome: Equatable {
    var events: [String] = []
    var body: [UInt8] = []
    var error: String?

    mutating func add(_ e: HTTP1Event) {
        if case .body(let b) = e {
            body.append(contentsOf: b)
            return
        }
        flushBody()
        events.append("\(e)")
    }

    mutating func flushBody() {
        guard !body.isEmpty else { return }
        events.append("body:" + body.map { String($0, radix: 16) }.joined(separator: " "))
        body.removeAll()
    }
}

/// One cache for every input and both roles (a line's parse depends on its bytes only).
let sharedLines = HTTP1Parser.FieldLineCache()

func run(_ role: HTTP1Parser.Role, _ pieces: [ArraySlice<UInt8>], eof: Bool, direct: Bool = false,
         cache: HTTP1Parser.FieldLineCache? = nil) -> Outcome {
    var parser = HTTP1Parser(role: role, limits: HTTP1Limits(maxHeaderBytes: 4096, maxRequestTarget: 1024, maxHeaderCount: 32))
    parser.lineCache = cache
    if role == .client {
        for m in ["GET", "HEAD", "POST", "GET"] { parser.expectResponse(to: m) }
    }
    var out = Outcome()
    func drain() -> Bool {
        while true {
            do {
                guard let e = try parser.next() else { return true }
                out.add(e)
            } catch {
                out.flushBody()
                out.error = error.reason + "@" + String(error.offset)
                return false
            }
        }
    }
    for p in pieces {
        guard direct else {
            parser.feed(Array(p))
            if !drain() { return out }
            continue
        }
        var rest = p
        while !rest.isEmpty {
            let limit = parser.directBodyLimit()
            if limit > 0 {
                let n = UInt64(rest.count) < limit ? rest.count : Int(limit)
                parser.consumeBody(n)
                out.body.append(contentsOf: rest.prefix(n))
                rest = rest.dropFirst(n)
            } else {
                parser.feed(Array(rest.prefix(7)))
                rest = rest.dropFirst(7)
            }
            if !drain() { return out }
        }
    }
    if eof {
        parser.feedEOF()
        _ = drain()
    }
    out.flushBody()
    return out
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzHTTP1(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size >= 1 else { return 0 }
    let control = data[0]
    let bytes = Array(UnsafeBufferPointer(start: data + 1, count: size - 1))
    let role: HTTP1Parser.Role = control & 1 == 0 ? .server : .client
    let eof = control & 2 != 0
    let whole = run(role, [bytes[...]], eof: eof)
    let cut = bytes.isEmpty ? 0 : Int(control >> 2) % (bytes.count + 1)
    let split = run(role, [bytes[..<cut], bytes[cut...]], eof: eof)
    if whole != split {
        fatalError("split at \(cut) changed the outcome:\nwhole: \(whole)\nsplit: \(split)")
    }
    let relayed = run(role, [bytes[..<cut], bytes[cut...]], eof: eof, direct: true)
    if whole != relayed {
        fatalError("relaying body bytes directly (split at \(cut)) changed the outcome:\nwhole: \(whole)\nrelayed: \(relayed)")
    }
    for pass in 1...2 {
        let cached = run(role, [bytes[..<cut], bytes[cut...]], eof: eof, cache: sharedLines)
        if whole != cached {
            fatalError("the shared line cache (pass \(pass)) changed the outcome:\nwhole: \(whole)\ncached: \(cached)")
        }
    }
    return 0
}
