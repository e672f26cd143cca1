import Testing
@testable import BearerdIO
#if canImport(Glibc)
import Glibc
#endif

/// docs/architecture.md §2.2: the loop poller is the default `io:` mode; `$BEARERD_IO` still picks either.
@Suite("io mode default")
struct IOModeTests {
    @Test func theLoopPollerIsTheDefault() {
        #expect(EventLoop.IOMode.defaultMode == .loopPoller)
        if getenv("BEARERD_IO") == nil {
            #expect(EventLoop.IOMode.fromEnvironment == .loopPoller)
        } else {
            // CI's second end-to-end pass sets it; the environment wins over the default.
            let v = String(cString: getenv("BEARERD_IO"))
            #expect(EventLoop.IOMode.fromEnvironment == EventLoop.IOMode(rawValue: v) ?? .loopPoller)
        }
    }
}
