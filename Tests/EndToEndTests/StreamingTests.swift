import Foundation
import Testing
import BearerdHTTP
import BearerdIO
import BearerdProxy
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdService

/// Bodies are streamed, never buffered whole: a large body passes both ways while the process's
/// resident memory stays flat. (`BEARERD_TEST_BIG_MIB` raises the size, e.g. 1024 for 1 GiB.)
@Suite("Streaming large bodies", .serialized)
struct StreamingTests {
    static let mib = Int(ProcessInfo.processInfo.environment["BEARERD_TEST_BIG_MIB"] ?? "") ?? 256

    @Test func largeUploadStreamsWithFlatMemory() throws {
        let origin = try TestOrigin(storeBodies: false) { r in .response(status: 200, headers: [], body: Array("\(r.bodyCount)".utf8)) }
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let total = Self.mib << 20
        let piece = TestOrigin.pattern(1 << 20)
        let c = try TestClient(port: proxy.port, timeout: 60)
        let before = currentRSS()
        var peak = before
        try c.send("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: \(total)\r\n\r\n")
        var expected: UInt64 = 0xcbf29ce484222325
        for b in piece { expected = (expected ^ UInt64(b)) &* 0x100000001b3 }
        for i in 0..<Self.mib {
            try c.send(piece)
            if i % 16 == 0 { peak = max(peak, currentRSS()) }
        }
        let r = try c.readResponse(method: "POST")
        #expect(r.status == 200)
        #expect(r.bodyText == "\(total)")
        #expect(origin.requests.first?.bodyCount == total)
        let growth = peak - before
        #expect(growth < 64 << 20, "RSS grew by \(growth >> 20) MiB while streaming \(Self.mib) MiB")
    }

    @Test func largeDownloadStreamsWithFlatMemory() throws {
        let total = Self.mib << 20
        let origin = try TestOrigin { _ in .stream(status: 200, length: total) }
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port, timeout: 60)
        try c.send("GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        let before = currentRSS()
        var peak = before
        var received = 0
        var sum: UInt64 = 0xcbf29ce484222325
        var expectedSum: UInt64 = 0xcbf29ce484222325
        let piece = TestOrigin.pattern(65536)
        var pieceIndex = 0
        let r = try c.readResponse { slice in
            for b in slice {
                sum = (sum ^ UInt64(b)) &* 0x100000001b3
                expectedSum = (expectedSum ^ UInt64(piece[pieceIndex])) &* 0x100000001b3
                pieceIndex = (pieceIndex + 1) & 0xFFFF
            }
            received += slice.count
            if received % (16 << 20) < slice.count { peak = max(peak, currentRSS()) }
        }
        #expect(r.status == 200)
        #expect(received == total)
        #expect(sum == expectedSum)
        let growth = peak - before
        #expect(growth < 64 << 20, "RSS grew by \(growth >> 20) MiB while streaming \(Self.mib) MiB")
    }

    @Test func slowClientPausesTheUpstream() throws {
        // 64 MiB to a client that does not read for a while: bearerd must stop reading the upstream
        // (backpressure) instead of buffering the body.
        let total = 64 << 20
        let origin = try TestOrigin { _ in .stream(status: 200, length: total) }
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port, timeout: 30)
        try c.send("GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        // Wait until the origin is stalled: its count has not moved for 300 ms.
        var streamed = -1
        var movedAt = Date()
        let stalled = eventually(seconds: 20) {
            let now = origin.streamedBytes
            if now != streamed {
                streamed = now
                movedAt = Date()
            }
            return now > 0 && Date().timeIntervalSince(movedAt) >= 0.3
        }
        #expect(stalled, "the origin never stalled: \(streamed >> 20) MiB sent")
        // What the origin got rid of sits in socket buffers (the origin's, bearerd's on both sides,
        // the client's; they autotune up to tcp_rmem max, 32 MiB on some machines) or in bearerd.
        // Subtracting what the kernel holds on both connections leaves what bearerd buffered, which
        // backpressure bounds by its channel's high-water mark plus one read, whatever the machine.
        // Measured on bytes, not process RSS: other suites run in this process at the same time.
        let kernel = KernelQueues.queuedBytes(ports: [origin.port, proxy.port])
        #expect(origin.streamedBytes == streamed, "the origin sent more while the kernel queues were read")
        #expect(streamed < total, "the origin sent the whole body to a stalled client (bearerd buffered it, or the socket buffers took it all)")
        let held = streamed - kernel
        #expect(held < 2 << 20, "bearerd holds \(held >> 10) KiB for a stalled client (origin sent \(streamed >> 10) KiB, kernel queues \(kernel >> 10) KiB)")
        var received = 0
        let r = try c.readResponse { received += $0.count }
        #expect(r.status == 200 && received == total)
    }
}
