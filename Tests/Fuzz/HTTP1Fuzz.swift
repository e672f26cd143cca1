// libFuzzer entry for the HTTP/1.1 parser (compiled by Tests/Fuzz/run.sh together with
// Sources/BearerdHTTP, not by SwiftPM). The first byte picks the role and a split point; the
// rest is the byte stream. Oracle: no crash, and the same events or the same error whether the
// stream arrives whole or in two pieces (the property the unit tests check on known inputs).

/// Events with adjacent body pieces merged, so different splits compare equal.
struct Outcome: Equatable {
    var events: [String] = []
    var error: String?

    mutating func add(_ e: HTTP1Event) {
        switch e {
        case .body(let b):
            let text = "body:" + String(decoding: b, as: UTF8.self)
            if let last = events.last, last.hasPrefix("body:") {
                events[events.count - 1] = last + String(decoding: b, as: UTF8.self)
            } else {
                events.append(text)
            }
        default:
            events.append("\(e)")
        }
    }
}

func run(_ role: HTTP1Parser.Role, _ pieces: [ArraySlice<UInt8>], eof: Bool) -> Outcome {
    var parser = HTTP1Parser(role: role, limits: HTTP1Limits(maxHeaderBytes: 4096, maxRequestTarget: 1024, maxHeaderCount: 32))
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
                out.error = error.reason + "@" + String(error.offset)
                return false
            }
        }
    }
    for p in pieces {
        parser.feed(Array(p))
        if !drain() { return out }
    }
    if eof {
        parser.feedEOF()
        _ = drain()
    }
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
    return 0
}
