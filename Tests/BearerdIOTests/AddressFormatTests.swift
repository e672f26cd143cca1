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

@Suite("SocketAddress.HostMemo")
struct HostMemoTests {
    @Test func theSameAddressGetsTheSameTextAndAnotherItsOwn() {
        var memo = SocketAddress.HostMemo()
        func text(_ address: SocketAddress) -> String { memo.host(of: address) }
        let samples = ["127.0.0.1", "127.0.0.1", "10.0.0.2", "::1", "::1", "fe80::1:2", "127.0.0.1", "0.0.0.0", "::"]
        for (i, host) in samples.enumerated() {
            let address = SocketAddress.numeric(host, port: UInt16(1000 + i))!  // ports differ: the host alone counts
            let first = text(address)
            let again = text(address)
            #expect(first == host)
            #expect(again == host)
            #expect(address.host == host)
        }
        // IPv4 0.0.0.0 and IPv6 :: have the same (zero) bytes: the family tells them apart.
        let v4 = text(SocketAddress.numeric("0.0.0.0", port: 1)!)
        let v6 = text(SocketAddress.numeric("::", port: 1)!)
        let unix = text(SocketAddress.unix("/run/x.sock")!)
        let back = text(SocketAddress.numeric("127.0.0.1", port: 1)!)
        #expect(v4 == "0.0.0.0")
        #expect(v6 == "::")
        #expect(unix == "unix")
        #expect(back == "127.0.0.1")
    }
}
