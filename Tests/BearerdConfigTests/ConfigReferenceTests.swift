import Foundation
import Testing
@testable import BearerdConfig

/// The configuration reference (`ConfigReference`) against the loader's own key tables, and the
/// committed docs/configuration.md and docs/configuration.schema.json against the generators.
@Suite struct ConfigReferenceTests {
    static let root: URL = {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<3 { url.deleteLastPathComponent() }
        return url
    }()

    /// Every key the loader accepts is documented, and nothing else: a key added to `ConfigKeys`
    /// without a row in `ConfigReference.sections` (or a row left after a key is removed) fails here.
    @Test func referenceHasExactlyTheLoadersKeys() {
        let loader = ConfigKeys.sections
        let reference = ConfigReference.sections
        #expect(reference.map(\.path) == loader.map(\.section), "sections differ from ConfigKeys.sections")
        var parserPairs = Set<String>(), referencePairs = Set<String>()
        for (section, keys) in loader { for k in keys { parserPairs.insert("\(section).\(k)") } }
        for s in reference {
            for k in s.keys {
                #expect(referencePairs.insert("\(s.path).\(k.name)").inserted, "\(s.path).\(k.name) is listed twice in ConfigReference")
            }
        }
        for missing in parserPairs.subtracting(referencePairs).sorted() {
            Issue.record("\(missing) is accepted by the loader (ConfigKeys) but missing from ConfigReference.sections")
        }
        for extra in referencePairs.subtracting(parserPairs).sorted() {
            Issue.record("\(extra) is in ConfigReference.sections but the loader (ConfigKeys) refuses it")
        }
        #expect(parserPairs.count > 100)
        // Each key keeps the loader's order within its section (the reference reads like the parser).
        for (section, keys) in loader {
            #expect(ConfigReference.section(section)?.keys.map(\.name) == keys, "order of \(section)")
        }
    }

    /// Every row is filled in, names a page that exists, and nested types name real sections.
    @Test func rowsAreCompleteAndLinked() {
        var referenced = Set<String>()
        func visit(_ type: ConfigReference.ValueType) {
            switch type {
            case .section(let p), .namedSections(let p), .sectionList(let p): referenced.insert(p)
            case .oneOrList(let t, _), .list(let t, _), .map(let t): visit(t)
            case .either(let forms): forms.forEach(visit)
            default: break
            }
        }
        for s in ConfigReference.sections {
            #expect(!s.summary.isEmpty && !s.id.isEmpty)
            for k in s.keys {
                let where_ = "\(s.path).\(k.name)"
                #expect(!k.description.isEmpty && !k.example.isEmpty && !k.defaultValue.isEmpty, "\(where_) has an empty cell")
                let page = String(k.see.prefix { $0 != " " })
                #expect(FileManager.default.fileExists(atPath: Self.root.appendingPathComponent(page).path), "\(where_): see \(page) does not exist")
                visit(k.type)
            }
        }
        let nested = Set(ConfigReference.sections.map(\.path)).subtracting(["(top level)"])
        #expect(referenced == nested, "sections never referenced or references to missing sections")
        #expect(Set(ConfigReference.sections.map(\.id)).count == ConfigReference.sections.count, "schema ids must be unique")
    }

    /// Enumerations are the parser's: the values it accepts, no more.
    @Test func choicesAreTheParsersEnums() {
        func choice(_ section: String, _ key: String) -> [String]? {
            guard let k = ConfigReference.section(section)?.keys.first(where: { $0.name == key }), case .choice(let v) = k.type else { return nil }
            return v
        }
        #expect(choice("sessions.NAME", "grant") == GrantType.allCases.map(\.rawValue))
        #expect(choice("(top level)", "io") == ["sources", "poller"])
        #expect(choice("routes[N]", "http2") == ["auto", "prior_knowledge", "off"])
        #expect(choice("sessions.NAME.sinks[N]", "format") == ["token", "header", "json"])
        #expect(choice("log", "level")?.contains("trace") == true)
    }

    /// The integer ranges of the reference are the loader's: the bounds parse, one past them does not.
    @Test(arguments: [("loops", "", 1...1024), ("headers", "limits", 1...10_000)])
    func integerRangesMatchTheLoader(key: String, section: String, range: ClosedRange<Int>) {
        let k = ConfigReference.section(section.isEmpty ? "(top level)" : section)?.keys.first { $0.name == key }
        guard case .integer(let documented)? = k?.type else { Issue.record("\(key) is not an integer in the reference"); return }
        #expect(documented == range)
        func parses(_ n: Int) -> Bool {
            let yaml = section.isEmpty ? "\(key): \(n)\n" : "\(section):\n  \(key): \(n)\n"
            return (try? ConfigLoader.parse(yaml: yaml + "routes: [{ match: /, upstream: http://127.0.0.1:9 }]\n",
                                            file: "/tmp/r.yaml", environment: [:], checkFiles: false)) != nil
        }
        #expect(parses(documented.lowerBound) && parses(documented.upperBound))
        #expect(!parses(documented.lowerBound - 1) && !parses(documented.upperBound + 1))
    }

    static let regenerate = """
        regenerate with:
          swift run bearerd config reference > docs/configuration.md
          swift run bearerd config schema > docs/configuration.schema.json
        """

    @Test func committedReferenceIsGenerated() throws {
        let committed = try String(contentsOf: Self.root.appendingPathComponent("docs/configuration.md"), encoding: .utf8)
        #expect(committed == ConfigReference.markdown(), "docs/configuration.md is out of date; \(Self.regenerate)")
    }

    @Test func committedSchemaIsGenerated() throws {
        let committed = try String(contentsOf: Self.root.appendingPathComponent("docs/configuration.schema.json"), encoding: .utf8)
        #expect(committed == ConfigReference.jsonSchema(), "docs/configuration.schema.json is out of date; \(Self.regenerate)")
        // Well-formed JSON with the draft and the closed top level.
        let object = try JSONSerialization.jsonObject(with: Data(committed.utf8)) as? [String: Any]
        #expect(object?["$schema"] as? String == "https://json-schema.org/draft/2020-12/schema")
        #expect(object?["additionalProperties"] as? Bool == false)
        #expect((object?["properties"] as? [String: Any])?.keys.sorted() == ConfigKeys.top.sorted())
    }

    @Test func exampleNamesTheSchema() throws {
        let text = try String(contentsOf: Self.root.appendingPathComponent("config.example.yaml"), encoding: .utf8)
        #expect(text.hasPrefix("# yaml-language-server: $schema=docs/configuration.schema.json\n"))
    }
}
