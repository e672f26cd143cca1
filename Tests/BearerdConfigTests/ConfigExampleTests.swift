import Foundation
import Testing
@testable import BearerdConfig
@testable import BearerdProxyCore
@testable import BearerdSessions

/// `config.example.yaml` at the repository root must parse and must document every key the
/// loader accepts (the key list comes from the loader's own tables, so a new key fails here
/// until it is documented).
@Suite struct ConfigExampleTests {
    static let examplePath: String = {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<3 { url.deleteLastPathComponent() }
        return url.appendingPathComponent("config.example.yaml").path
    }()

    @Test func exampleParses() throws {
        let config = try ConfigLoader.load(path: Self.examplePath, environment: [:], checkFiles: false)
        #expect(config.sessions.map(\.name) == ["partner", "me", "legacy", "sts", "person", "kiosk", "github", "workload", "k8s", "exchanged", "federated", "bound", "store", "oss", "mcp", "caller", "entra_obo"])
        #expect(config.sessions.first { $0.name == "mcp" }?.issuerSource?.fromUpstream?.allowed.map(\.description) == ["https://auth.example.com"])
        // On behalf of callers (docs/guides/on-behalf-of.md): both shapes, and a route guarded by caller_jwt alone.
        let caller = config.sessions.first { $0.name == "caller" }
        #expect(caller?.exchange?.subject == .caller)
        #expect(caller?.onBehalfOf?.maxEntries == 10_000)
        #expect(caller?.onBehalfOf?.callerJWT?.issuer == "https://login.example.com")
        #expect(config.sessions.first { $0.name == "entra_obo" }?.onBehalfOf != nil)
        #expect(config.routes.contains { $0.callerJWT != nil && $0.session == "partner" })
        #expect(config.sessions.first { $0.name == "bound" }?.dpop == true)
        #expect(Set(config.sessions.map(\.grant)) == Set(GrantType.allCases))
        #expect(config.routes.count >= 3)
        #expect(config.routes.contains { $0.session == nil })
        #expect(config.listen.count == 3)
        #expect(config.admin != nil)
        #expect(config.stateDir != nil)
    }

    @Test func exampleDocumentsEveryKey() throws {
        let text = try String(contentsOfFile: Self.examplePath, encoding: .utf8)
        // A key is documented when it appears as `key:` at a key position, in use or in a comment.
        let lines = text.split(separator: "\n").map(String.init)
        func documented(_ key: String) -> Bool {
            lines.contains { line in
                var rest = Substring(line)
                while let range = rest.range(of: key + ":") {
                    let before = rest[..<range.lowerBound].last
                    if before == nil || before == " " || before == "{" || before == "," || before == "#" || before == "-" {
                        return true
                    }
                    rest = rest[range.upperBound...]
                }
                return false
            }
        }
        var all: [String] = []
        for (section, keys) in ConfigKeys.sections {
            for key in keys {
                all.append(key)
                #expect(documented(key), "\(section).\(key) is not documented in config.example.yaml")
            }
        }
        #expect(all.count > 40)
    }
}
