import Testing
@testable import BearerdConfig
@testable import BearerdProxyCore

/// The Host allowlist of loopback listeners (DNS rebinding guard, docs/architecture.md §4).
@Suite("Host allowlist")
struct HostAllowlistTests {
    static let listener = ListenerConfig(address: .tcp(host: "127.0.0.1", port: 8080), allowedHosts: ["api.internal", "[::2]"])
    static let list = HostAllowlist(listener: listener, routeHosts: ["Partner.Example"])

    @Test(arguments: [
        "localhost", "localhost:8080", "LOCALHOST:1", "localhost.", "api.localhost", "a.b.Localhost:9",
        "127.0.0.1", "127.0.0.1:8080", "127.1.2.3:80", "127.255.255.255", "127.0.0.1.",
        "[::1]", "[::1]:8080", "[0:0:0:0:0:0:0:1]:1", "[::ffff:127.0.0.1]:8080",
        "partner.example", "PARTNER.example:443", "api.internal", "api.internal:8080", "[::2]:99",
    ])
    func admitted(_ host: String) {
        #expect(Self.list.admits(Substring(host)))
    }

    @Test(arguments: [
        "evil.example", "evil.example:8080", "localhost.evil.example", "evillocalhost", "xlocalhost:80",
        "127.0.0.1.evil.example", "128.0.0.1", "127.0.0", "127.0.0.256", "127..0.1", "1270.0.0.1",
        "::1", "[::1", "[::1]x", "[::1]:8o", "localhost:80:80", "localhost:http", "", ":80", "[]", ".",
        "api.internal.evil", "partner.example.evil", "[::3]",
    ])
    func refused(_ host: String) {
        #expect(!Self.list.admits(Substring(host)))
    }

    @Test func missingHostIsRefused() {
        #expect(Self.list.admits(nil))  // HTTP/1.0 without Host: no browser sends that
    }

    @Test func starAdmitsAnything() {
        let any = HostAllowlist(listener: ListenerConfig(address: .tcp(host: "127.0.0.1", port: 1), allowedHosts: ["*"]), routeHosts: [])
        #expect(any.allowsAny)
        #expect(any.admits("evil.example"))
        #expect(any.admits(nil))
        #expect(!Self.list.allowsAny)
    }

    @Test func theListenersOwnAddressIsAllowed() {
        let v6 = HostAllowlist(listener: ListenerConfig(address: .tcp(host: "::1", port: 8080)), routeHosts: [])
        #expect(v6.admits("[::1]:8080"))
        let named = HostAllowlist(listener: ListenerConfig(address: .tcp(host: "proxy.localhost.test", port: 80)), routeHosts: [])
        #expect(named.admits("Proxy.Localhost.Test:80"))
        #expect(!named.admits("other.test"))
        // A remote listener's own address too (when its Host is checked at all).
        let lan = HostAllowlist(listener: ListenerConfig(address: .tcp(host: "10.0.0.5", port: 80), allowRemote: true), routeHosts: [])
        #expect(lan.admits("10.0.0.5:80"))
        #expect(!lan.admits("10.0.0.6:80"))
    }

    @Test func hostPartStripsPortBracketsAndOneTrailingDot() {
        #expect(HostAllowlist.hostPart("a.example:8080") == "a.example")
        #expect(HostAllowlist.hostPart("a.example:") == "a.example")
        #expect(HostAllowlist.hostPart("[::1]:80") == "::1")
        #expect(HostAllowlist.hostPart("[::1]") == "::1")
        #expect(HostAllowlist.hostPart("localhost.") == "localhost")
        #expect(HostAllowlist.hostPart("a:b:c") == nil)
        #expect(HostAllowlist.hostPart("[::1]junk") == nil)
        #expect(HostAllowlist.hostPart("") == nil)
    }

    @Test func absoluteFormAuthorityWinsOverHost() {
        // RFC 9112 §3.2.2: the target's authority replaces Host.
        #expect(HostAllowlist.requestAuthority(target: "http://evil.example:8080/x", hostField: "localhost") == "evil.example:8080")
        #expect(HostAllowlist.requestAuthority(target: "HTTP://localhost/x?q", hostField: "evil.example") == "localhost")
        #expect(HostAllowlist.requestAuthority(target: "/x", hostField: "localhost:1") == "localhost:1")
        #expect(HostAllowlist.requestAuthority(target: "/x", hostField: nil) == nil)
        let target = "http://evil.example/partner/"
        #expect(!Self.list.admits(HostAllowlist.requestAuthority(target: target, hostField: "localhost")))
    }

    @Test func keysCompareAndHashCaseInsensitively() {
        let set: Set<HostKey> = [HostKey("api.example")]
        #expect(set.contains(HostKey("API.Example")))
        #expect(!set.contains(HostKey("api.exampl")))
        #expect(HostKey("A") == HostKey("a"))
        #expect(HostKey("a") != HostKey("b"))
    }
}
