// Peer addresses are formatted without inet_ntop (glibc's IPv4 path is sprintf), exactly as
// inet_ntop writes them.

import Testing
@testable import BearerdIO
#if canImport(Glibc)
import Glibc
#endif

@Suite("SocketAddress formatting")
struct AddressFormatTests {
    @Test func dottedQuadMatchesInetNtop() {
        var samples: [[UInt8]] = [[0, 0, 0, 0], [127, 0, 0, 1], [255, 255, 255, 255], [10, 99, 100, 9], [192, 168, 1, 254]]
        for v in 0...255 { samples.append([UInt8(v), UInt8(255 - v), UInt8(v / 3), UInt8(v % 10)]) }
        for octets in samples {
            var addr = in_addr()
            withUnsafeMutableBytes(of: &addr) { $0.copyBytes(from: octets) }
            var buf = [CChar](repeating: 0, count: Int(INET_ADDRSTRLEN))
            inet_ntop(AF_INET, &addr, &buf, socklen_t(buf.count))
            let expected = String(cString: buf)
            #expect(octets.withUnsafeBytes { SocketAddress.dottedQuad($0) } == expected)
            #expect(SocketAddress.numeric(expected, port: 80)?.host == expected)
        }
    }
}
