import Foundation
import Logging
import Testing
@testable import BearerdConfig
@testable import BearerdProxyCore
@testable import BearerdSessions
@testable import BearerdService
import BearerdOAuth

@Suite("Access log line")
struct AccessLogTests {
    let record = AccessRecord(method: "GET", path: "/a \"b\"", route: "/", status: 200, upstreamMicros: 1234,
                              totalMicros: 56, bytes: 100, outcome: nil, session: "partner", generation: 3, replayed: true)

    @Test func logfmtInFixedOrder() {
        #expect(record.logfmt == #"method=GET path="/a \"b\"" route=/ status=200 upstream_ms=1.234 total_ms=0.056 bytes=100 session=partner token.generation=3 replayed=1"#)
        var r = record
        r.upstreamMicros = -1
        #expect(r.logfmt.contains("upstream_ms=-"))
    }

    /// A value never breaks or forges a text line: control bytes and DEL are quoted and escaped,
    /// in every field (methods, names and protocols included).
    @Test func logfmtQuotesControlBytesInEveryValue() {
        var r = AccessRecord(method: "G\nET", path: "/a\tb", route: "/\u{7F}", status: 200, upstreamMicros: 1, totalMicros: 1, bytes: 0,
                             outcome: "x\ry", session: "s\n", generation: nil, replayed: false)
        r.protocolName = "h1\u{1}"
        r.upstreamProtocol = "h2 x"
        #expect(r.logfmt == #"method="G\nET" path="/a\tb" route="/\#u{7F}" status=200 upstream_ms=0.001 total_ms=0.001 bytes=0 outcome="x\ry" session="s\n" protocol="h1\u0001" upstream_protocol="h2 x""#)
        var bytes: [UInt8] = []
        r.appendLogfmt(to: &bytes)
        #expect(String(decoding: bytes, as: UTF8.self) == r.logfmt)
        #expect(!r.logfmt.contains("\n") && !r.logfmt.contains("\r"))
    }

    /// The byte writers of the hot path produce exactly the string forms.
    @Test(arguments: [
        AccessRecord(method: "GET", path: "/a \"b\"", route: "/", status: 200, upstreamMicros: 1234, totalMicros: 56, bytes: 100,
                     outcome: nil, session: "partner", generation: 3, replayed: true),
        AccessRecord(method: "POST", path: "/x=\u{1}\\\n\t\r/é", route: "", status: 502, upstreamMicros: -1, totalMicros: 12_345_678,
                     bytes: .max, outcome: "upstream.connect", session: nil, generation: nil, replayed: false),
        AccessRecord(method: "GET", path: "/", route: "/r", status: 0, upstreamMicros: 0, totalMicros: 0, bytes: 0,
                     outcome: "client.aborted", session: "s", generation: 0, replayed: false),
    ])
    func byteWritersMatchTheStringForms(record: AccessRecord) {
        var r = record
        r.protocolName = "h2"
        r.upstreamProtocol = "h1"
        r.grpcStatus = "16 x"
        for rec in [record, r] {
            var text: [UInt8] = []
            rec.appendLogfmt(to: &text)
            #expect(String(decoding: text, as: UTF8.self) == rec.logfmt)
            var json: [UInt8] = []
            rec.appendJSONFields(to: &json)
            #expect(String(decoding: json, as: UTF8.self) == rec.jsonFields)
        }
        var ts: [UInt8] = []
        LineBytes.timestamp(&ts)
        let t = String(decoding: ts, as: UTF8.self)
        #expect(t.utf8.count == 24 && t.hasSuffix("Z") && t.dropFirst(10).first == "T", "\(t)")
    }

    /// The computed civil date and time agree with gmtime_r for instants spread over the
    /// years 0...9999 (leap days, century and 400-year rules, the epoch, before it).
    @Test func timestampsMatchGmtime() {
        func reference(_ seconds: Int64, _ ms: Int) -> String {
            var t = time_t(seconds)
            var tmv = tm()
            gmtime_r(&t, &tmv)
            func pad(_ v: Int, _ w: Int) -> String {
                let s = String(v)
                return String(repeating: "0", count: max(0, w - s.count)) + s
            }
            return "\(pad(Int(tmv.tm_year) + 1900, 4))-\(pad(Int(tmv.tm_mon) + 1, 2))-\(pad(Int(tmv.tm_mday), 2))T"
                + "\(pad(Int(tmv.tm_hour), 2)):\(pad(Int(tmv.tm_min), 2)):\(pad(Int(tmv.tm_sec), 2)).\(pad(ms, 3))Z"
        }
        var samples: [Int64] = [0, -1, 59, 86_399, 86_400, 951_782_400 /* 2000-02-29 */, 4_107_542_400 /* 2100-03-01 */,
                                1_798_675_200, -62_167_219_200 /* 0000-01-01 */, 253_402_300_799 /* 9999-12-31T23:59:59 */,
                                -2_208_988_800 /* 1900-01-01 */, 68_169_600 /* 1972-02-29 */]
        var state: UInt64 = 0x7157_0001
        for _ in 0..<5_000 {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            samples.append(Int64(state % 315_569_520_000) - 62_167_219_200)
        }
        for (i, seconds) in samples.enumerated() {
            var out: [UInt8] = []
            LineBytes.timestamp(seconds: seconds, millis: i % 1000, &out)
            let got = String(decoding: out, as: UTF8.self)
            if got != reference(seconds, i % 1000) {
                Issue.record("\(seconds): \(got) vs \(reference(seconds, i % 1000))")
                break
            }
        }
        // Outside 0...9999 the year is clamped, never a wrong digit or a trap.
        var far: [UInt8] = []
        LineBytes.timestamp(seconds: .max, millis: 5_000, &far)
        #expect(String(decoding: far, as: UTF8.self) == "9999-12-31T23:59:59.999Z")
        far = []
        LineBytes.timestamp(seconds: .min, millis: -1, &far)
        #expect(String(decoding: far, as: UTF8.self) == "0000-01-01T00:00:00.000Z")
    }

    /// The runtime hands access lines straight to bearerd's handler; the line is the
    /// one the Logger path writes, timestamps aside, in both formats.
    /// Paths for the direct line: an ordinary one (written in the stack buffer), one too long
    /// for it (written again into an array: the line must still be whole), and one holding a
    /// credential marker (redacted on the buffer path as on the array path).
    static let paths = ["/a \"b\"", "/" + String(repeating: "long/", count: 400) + "end", "/x/password=hunter2/y"]

    @Test(arguments: [LogFormat.json, .text], [0, 1, 2])
    func directAccessLineEqualsTheLoggerOne(format: LogFormat, pathIndex: Int) throws {
        var record = self.record
        record.path = Self.paths[pathIndex]
        var fds: [Int32] = [0, 0]
        #expect(pipe(&fds) == 0)
        let sink = LogSink(fd: fds[1])
        let handler = BearerdLogHandler(label: "t", level: .info, format: format, sink: sink)
        let logger = Logger(label: "t") { _ in handler }
        logger.info("request", metadata: ["access": .stringConvertible(record)])
        let direct = try #require(logger.handler as? BearerdLogHandler)
        direct.writeAccess(record)
        sink.flush()
        close(fds[1])
        let data = FileHandle(fileDescriptor: fds[0]).readDataToEndOfFile()
        let lines = String(decoding: data, as: UTF8.self).split(separator: "\n").map(String.init)
        try #require(lines.count == 2)
        // The timestamp is the only field that may differ: 24 characters at the same place.
        func withoutTimestamp(_ l: String) -> String {
            let start = format == .json ? 7 : 0
            return String(l.prefix(start)) + String(l.dropFirst(start + 24))
        }
        #expect(withoutTimestamp(lines[0]) == withoutTimestamp(lines[1]))
        #expect(lines[1].contains("request"))
        #expect(lines[1].hasSuffix(format == .json ? "}" : "replayed=1"))  // whole, not cut at 1 KiB
        #expect(lines[1].contains("long/end") == (pathIndex == 1))
        #expect(!lines[1].contains("hunter2"))
        #expect(lines[1].contains("password=<redacted>") == (pathIndex == 2))
    }

    @Test func jsonLineParsesThroughTheHandler() throws {
        var fds: [Int32] = [0, 0]
        #expect(pipe(&fds) == 0)
        let sink = LogSink(fd: fds[1])
        let handler = BearerdLogHandler(label: "t", level: .info, format: .json, sink: sink)
        let logger = Logger(label: "t") { _ in handler }
        logger.info("request", metadata: ["access": .stringConvertible(record)])
        sink.flush()
        close(fds[1])
        let data = FileHandle(fileDescriptor: fds[0]).readDataToEndOfFile()
        let line = try #require(String(data: data, encoding: .utf8)?.split(separator: "\n").first)
        let obj = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(obj["msg"] as? String == "request")
        #expect(obj["path"] as? String == "/a \"b\"")
        #expect(obj["status"] as? Int == 200)
        #expect(obj["token.generation"] as? Int == 3)
        #expect(obj["replayed"] as? Bool == true)
    }

    /// The access line is scanned whole only when a value holds a credential marker (its keys,
    /// numbers, timestamp and level are bearerd's own). In JSON, the line is exactly the one the
    /// scan of every line made, for values with markers at every place, escaped quotes,
    /// backslashes and newlines included. In text, it differs only where a value ends in a
    /// marker: the whole-line scan then ran on into the next field and redacted bearerd's own
    /// `key=value` there.
    @Test(arguments: [LogFormat.json, .text])
    func valuesScannedAloneRedactAsTheWholeLineDid(format: LogFormat) throws {
        let pieces = ["bearer ", "Bearer ", "basic ", "BASIC ", "access_token", "refresh_token", "id_token", "client_secret",
                      "password", "Cookie:", "set-cookie:", "=", ":", " ", "'", "<x>", "SECRET", "/", "x", "é", ".", "_", "&",
                      ",", ";", "?", "-", "1", "\"", "\\", "\n"]
        var state: UInt64 = 0xACCE_5510 &+ (format == .json ? 0 : 1)
        func next(_ n: Int) -> Int {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return Int(truncatingIfNeeded: (state >> 33) % UInt64(n))
        }
        func value() -> String { (0..<next(6)).map { _ in pieces[next(pieces.count)] }.joined() }
        func optional() -> String? { next(3) == 0 ? nil : value() }
        var records: [AccessRecord] = []
        for _ in 0..<3_000 {
            var r = AccessRecord(method: next(4) == 0 ? value() : "GET", path: "/" + value(), route: value(), status: 200,
                                 upstreamMicros: 5, totalMicros: 7, bytes: 9, outcome: optional(), session: optional(),
                                 generation: 1, replayed: false)
            r.protocolName = optional()
            r.upstreamProtocol = optional()
            r.grpcStatus = optional()
            records.append(r)
        }
        // Two fixed text cases of the one difference.
        var endsInMarker = record
        endsInMarker.path = "/x/bearer"
        records.append(endsInMarker)
        endsInMarker.path = "/x/password:"
        records.append(endsInMarker)

        let file = memfdLikeTempFile()
        defer { close(file.fd) }
        let sink = LogSink(fd: file.fd)
        let handler = BearerdLogHandler(label: "t", level: .info, format: format, sink: sink)
        for r in records { handler.writeAccess(r) }
        sink.flush()
        let lines = file.read().split(separator: "\n", omittingEmptySubsequences: false).dropLast().map(String.init)
        try #require(lines.count == records.count)

        let ts = "2000-01-01T00:00:00.000Z"
        func stamped(_ line: String) -> String {
            let start = format == .json ? 7 : 0
            return String(line.prefix(start)) + ts + String(line.dropFirst(start + 24))
        }
        func wholeLine(_ r: AccessRecord) -> String {
            format == .json ? #"{"ts":""# + ts + #"","level":"info","msg":"request","# + r.jsonFields + "}"
                            : ts + " info request " + r.logfmt
        }
        /// Whether a value ends in a marker (and the bytes the scan skips after one).
        func endsInAMarker(_ r: AccessRecord) -> Bool {
            let values = [r.method, r.path, r.route, r.outcome, r.session, r.protocolName, r.upstreamProtocol, r.grpcStatus].compactMap { $0 }
            return values.contains { v in
                let trimmed = String(v.lowercased().reversed().drop { " \"':=\\".contains($0) }.reversed())
                return Redaction.markers.contains { m in
                    let word = String(decoding: m, as: UTF8.self).trimmingCharacters(in: CharacterSet(charactersIn: " :"))
                    return trimmed.hasSuffix(word)
                }
            }
        }
        var redacted = 0, differences = 0
        for (r, line) in zip(records, lines) {
            let old = Redaction.scrub(wholeLine(r))
            let got = stamped(line)
            if old != wholeLine(r) { redacted += 1 }
            if format == .json || !endsInAMarker(r) {
                #expect(got == old)
            } else if got != old {
                differences += 1
                #expect(got == wholeLine(r), "only the run-on redaction is gone: \(got) vs \(old)")
            }
        }
        #expect(redacted > 500, "the generator must produce credentials: \(redacted)")
        if format == .text {
            #expect(differences >= 2)
            #expect(lines[lines.count - 2].contains("path=/x/bearer route=/ status=200"))
            #expect(lines[lines.count - 1].contains("path=/x/password: route=/ status=200"))
        }
    }
}
