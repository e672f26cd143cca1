import Foundation
import Logging
import Testing
@testable import BearerdProxy
@testable import BearerdConfig
@testable import BearerdProxyCore
@testable import BearerdSessions
@testable import BearerdService

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
}
