import Foundation
import Logging
import Testing
@testable import BearerdService
@testable import BearerdConfig

/// Every line the log handler writes is scrubbed (docs/architecture.md §5: tokens and secrets never reach logs).
@Suite struct LogRedactionTests {
    @Test func logHandlerScrubsEveryLine() throws {
        let fd = memfdLikeTempFile()
        defer { close(fd.fd) }
        let sink = LogSink(fd: fd.fd)
        for format in LogFormat.allCases {
            let handler = BearerdLogHandler(label: "t", level: .trace, format: format, sink: sink)
            handler.log(level: .trace, message: "upstream said Bearer raw-SECRET-X", metadata: ["detail": "refresh_token=raw-SECRET-Y"],
                        source: "t", file: #file, function: #function, line: #line)
        }
        sink.flush()
        let text = fd.read()
        #expect(!text.isEmpty)
        #expect(!text.contains("raw-SECRET"))
        #expect(text.contains("<redacted>"))
    }
}

#if canImport(Glibc)
import Glibc
#endif
import Foundation

/// A temporary file to capture a LogSink's output.
func memfdLikeTempFile() -> (fd: Int32, read: () -> String) {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("bearerd-log-\(UUID().uuidString)").path
    let fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0o600)
    return (fd, { String(decoding: FileManager.default.contents(atPath: path) ?? Data(), as: UTF8.self) })
}
