import Testing
import BearerdIO
@testable import BearerdConfig
@testable import BearerdProxyCore
@testable import BearerdSessions

@Suite("io: key")
struct ConfigIOModeTests {
    let base = "routes:\n  - match: /\n    upstream: http://127.0.0.1:9\n"

    @Test func acceptsBothModesAndDefaultsToNil() throws {
        #expect(try ConfigLoader.parse(yaml: base, file: "c.yaml", environment: [:], checkFiles: false).ioMode == nil)
        #expect(try ConfigLoader.parse(yaml: "io: poller\n" + base, file: "c.yaml", environment: [:], checkFiles: false).ioMode == .poller)
        #expect(try ConfigLoader.parse(yaml: "io: sources\n" + base, file: "c.yaml", environment: [:], checkFiles: false).ioMode == .sources)
    }

    @Test func rejectsOtherValuesWithFileAndLine() {
        do {
            _ = try ConfigLoader.parse(yaml: "io: epoll\n" + base, file: "c.yaml", environment: [:], checkFiles: false)
            Issue.record("expected an error")
        } catch {
            #expect(error.description.contains("c.yaml:1: io: expected one of sources, poller"))
        }
    }
}
