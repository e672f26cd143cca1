import Dispatch
import Foundation
import Testing
@testable import BearerdService

/// `LogSink`: the thread that logs (an event loop) does not write to the fd unless the line is
/// urgent or 8 MiB are pending; every line arrives whole and in order, whichever thread flushed.
@Suite("Log sink")
struct LogSinkTests {
    /// Reads a pipe to its end on another thread.
    final class PipeReader: @unchecked Sendable {  // @unchecked: `data` is read after `done`
        private(set) var data = Data()
        private let done = DispatchSemaphore(value: 0)
        init(fd: Int32) {
            Thread.detachNewThread { [self] in
                data = FileHandle(fileDescriptor: fd, closeOnDealloc: true).readDataToEndOfFile()
                done.signal()
            }
        }
        func wait() -> Data {
            done.wait()
            return data
        }
    }

    /// A reader that does not read (the journal stalled, a full disk's pipe): a thread logging
    /// 1 MiB of lines still returns at once, the lines wait in the sink, and all of them arrive
    /// once the reader reads again. Writing at 64 KiB from the logging thread blocked it here.
    @Test func loggingThreadDoesNotWaitForABlockedReader() throws {
        var fds: [Int32] = [0, 0]
        try #require(pipe(&fds) == 0)
        let sink = LogSink(fd: fds[1])
        let line = Array(String(repeating: "x", count: 199).utf8)
        let lines = 5_000  // 1 MB: well past the pipe's 64 KiB, below the 8 MiB back-pressure limit
        let wrote = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            for _ in 0..<lines { sink.write(bytes: line, urgent: false) }
            wrote.signal()
        }
        let returned = wrote.wait(timeout: .now() + 10) == .success
        #expect(returned, "the logging thread blocked on the fd")
        let reader = PipeReader(fd: fds[0])
        if !returned { wrote.wait() }  // the reader unblocks it; then the counts below still run
        sink.flush()
        close(fds[1])
        let got = String(decoding: reader.wait(), as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false)
        #expect(got.count == lines + 1)  // the last newline leaves an empty tail
        #expect(got.dropLast().allSatisfy { $0.utf8.count == 199 })
    }

    /// Eight threads log at once, some lines urgent (written by the logging thread while the
    /// sink's queue may be writing an earlier chunk): no line is lost, cut or mixed with
    /// another, and each thread's lines arrive in the order it logged them.
    @Test func concurrentWritersKeepEveryLineWholeAndInOrder() throws {
        var fds: [Int32] = [0, 0]
        try #require(pipe(&fds) == 0)
        let sink = LogSink(fd: fds[1])
        let reader = PipeReader(fd: fds[0])
        let threads = 8, perThread = 3_000
        let group = DispatchGroup()
        for t in 0..<threads {
            group.enter()
            Thread.detachNewThread {
                for n in 0..<perThread {
                    // Lengths from 20 to ~400 bytes, so chunk boundaries fall anywhere.
                    let padding = String(repeating: "p", count: 1 + (n &* 37 &+ t &* 11) % 380)
                    sink.write("t=\(t) n=\(n) \(padding) end", urgent: n % 97 == 0)
                }
                group.leave()
            }
        }
        group.wait()
        sink.flush()
        close(fds[1])
        let text = String(decoding: reader.wait(), as: UTF8.self)
        var next = [Int](repeating: 0, count: threads)
        var bad = 0
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: " ")
            guard parts.count == 4, parts[3] == "end", parts[0].hasPrefix("t="), parts[1].hasPrefix("n="),
                  let t = Int(parts[0].dropFirst(2)), let n = Int(parts[1].dropFirst(2)), t >= 0, t < threads,
                  parts[2].allSatisfy({ $0 == "p" }) else {
                bad += 1
                continue
            }
            if n != next[t] { bad += 1 }
            next[t] = n + 1
        }
        #expect(bad == 0)
        #expect(next == [Int](repeating: perThread, count: threads))
    }
}
