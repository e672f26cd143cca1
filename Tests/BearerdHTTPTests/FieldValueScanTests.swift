import Testing
@testable import BearerdHTTP

/// The field-value check reads whole words and then the tail as the line's overlapping last
/// word: a bad byte at any position of values of any length, after names and OWS of any
/// length, must be found as when the bytes were checked one by one.
@Suite struct FieldValueScanTests {
    @Test func everyPositionOfEveryShortValue() {
        let bad: [(UInt8, String)] = [(0x01, "http1.invalid_field_value"), (0x7F, "http1.invalid_field_value"), (0x0B, "http1.invalid_field_value")]
        for name in ["X", "X-Name-Long"] {
            for ows in ["", " ", "\t", " \t "] {
                for length in 1...19 {
                    let good = Array(repeating: UInt8(ascii: "v"), count: length)
                    let line = Array("\(name):\(ows)".utf8) + good
                    let ok = parse(line)
                    #expect(ok?.reason == nil, "\(name) \(ows.utf8.count) \(length): \(String(describing: ok))")
                    for at in 0..<length {
                        for (b, reason) in bad {
                            var v = good
                            v[at] = b
                            let e = parse(Array("\(name):\(ows)".utf8) + v)
                            #expect(e?.reason == reason, "\(name) ows \(ows.utf8.count) length \(length) at \(at) byte \(b)")
                        }
                        var tab = good  // HTAB inside a value is allowed
                        tab[at] = asciiHTAB
                        if at > 0 && at < length - 1 { #expect(parse(Array("\(name):\(ows)".utf8) + tab)?.reason == nil) }
                    }
                }
            }
        }
    }

    @Test func highBytesInTheTailAreStillUTF8Checked() {
        // "é" (C3 A9) valid; C3 28 invalid; at the very end of values of several lengths.
        for length in 0...12 {
            let prefix = Array(repeating: UInt8(ascii: "a"), count: length)
            #expect(parse(Array("X: ".utf8) + prefix + [0xC3, 0xA9])?.reason == nil)
            #expect(parse(Array("X: ".utf8) + prefix + [0xC3, 0x28])?.reason == "http1.invalid_field_value")
        }
    }

    /// The error (nil: none) of a request whose one extra field line is `line`.
    private func parse(_ line: [UInt8]) -> HTTP1Error? {
        var p = HTTP1Parser(role: .server)
        p.feed(Array("GET / HTTP/1.1\r\nHost: h\r\n".utf8) + line + Array("\r\n\r\n".utf8))
        do {
            while let e = try p.next() {
                if case .end = e { return nil }
            }
            return HTTP1Error(reason: "incomplete", offset: 0, message: "")
        } catch {
            return error
        }
    }
}
