// The allowlist's byte-level fast path (built-in loopback names scanned in place) decides
// exactly as the Substring path does.

import Testing
@testable import BearerdProxyCore

@Suite("Host allowlist on bytes")
struct HostAllowlistBytesTests {
    static let authorities: [String] = [
        "127.0.0.1", "127.0.0.1:18180", "127.0.0.1.", "127.1.2.3:80", "127.0.0.256", "127.0.0", "127.0.0.1.1",
        "128.0.0.1", "0127.0.0.1", "localhost", "LOCALHOST:8080", "localhost.", "a.localhost", "A.LocalHost:1",
        ".localhost", "localhost:", "localhost:8x", "localhost::80", "[::1]", "[::1]:8080", "[0:0:0:0:0:0:0:1]",
        "[::ffff:127.0.0.1]:80", "[::FFFF:127.9.9.9]", "[::ffff:10.0.0.1]", "[::2]", "[::1", "[::1]x", "[::1]:",
        "::1", "", ":80", ".", "api.example", "api.example:443", "API.EXAMPLE.", "evil.example", "10.0.0.1:80",
    ]

    @Test func bytesAndSubstringsDecideAlike() {
        for names in [[], ["api.example", "10.0.0.1"], ["*"]] {
            let list = HostAllowlist(names: names)
            for a in Self.authorities {
                #expect(list.admits(Substring(a)) == list.admitsByName(Substring(a)), "\(a) with \(names)")
            }
        }
    }

    @Test func hostRangeMatchesHostPart() {
        for a in Self.authorities {
            var s = a
            let viaBytes: String? = s.withUTF8 { b in HostAllowlist.hostRange(b).map { String(decoding: UnsafeBufferPointer(rebasing: b[$0]), as: UTF8.self) } }
            #expect(viaBytes == HostAllowlist.hostPart(Substring(a)).map(String.init), "\(a)")
        }
    }
}
