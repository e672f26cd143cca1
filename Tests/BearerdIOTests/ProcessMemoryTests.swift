// Releasing start-up's code pages: the resident set shrinks and the code still runs (its
// pages fault back in from the page cache).

import Testing
import Dispatch
@testable import BearerdIO
#if canImport(Glibc)
import Glibc
#endif

@Suite("Process memory")
struct ProcessMemoryTests {
    /// `Rss:` of /proc/self/smaps_rollup in KiB.
    static func residentKiB() -> Int? {
        let fd = open("/proc/self/smaps_rollup", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var buf = [UInt8](repeating: 0, count: 4096)
        let n = buf.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard n > 0 else { return nil }
        let text = String(decoding: buf[0..<n], as: UTF8.self)
        for line in text.split(separator: "\n") where line.hasPrefix("Rss:") {
            return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "")
        }
        return nil
    }

    @Test func releasingStartupCodeShrinksTheResidentSetAndTheCodeStillRuns() throws {
        let before = try #require(Self.residentKiB())
        let released = ProcessMemory.releaseStartupCode()
        let after = try #require(Self.residentKiB())
        #expect(released > 1 << 20)  // this test binary's code alone is megabytes
        #expect(after < before)
        // Code that ran before runs again (faulted back in): a loop, a socket, a formatted address.
        let loop = EventLoop(index: 0, ioMode: .loopPoller)
        #expect(SocketAddress.numeric("127.0.0.1", port: 80)?.host == "127.0.0.1")
        let done = DispatchSemaphoreBox()
        loop.execute { done.signal() }
        #expect(done.wait(seconds: 5))
    }
}

/// A semaphore without importing Dispatch's timing types into the test's expectations.
final class DispatchSemaphoreBox: @unchecked Sendable {  // @unchecked: a semaphore is thread-safe
    private let sem = DispatchSemaphore(value: 0)
    func signal() { sem.signal() }
    func wait(seconds: Int) -> Bool { sem.wait(timeout: .now() + .seconds(seconds)) == .success }
}
