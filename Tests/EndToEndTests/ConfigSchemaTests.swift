import Foundation
import Testing
import BearerdTestSupport

/// docs/configuration.schema.json with a real JSON Schema validator (jsonschema, from PyPI):
/// `bearerd config schema` prints the committed schema, the schema is valid draft 2020-12, every
/// shipped configuration passes it, and typos and wrong types that `bearerd check` refuses are
/// refused by the schema too (so an editor flags what check would).
@Suite("Configuration schema", .serialized,
       .enabled(if: Prerequisite.runs(PythonFixture.unavailable(modules: ["jsonschema", "yaml"]) == nil),
                "\(PythonFixture.unavailable(modules: ["jsonschema", "yaml"]) ?? "")"))
struct ConfigSchemaTests {
    static let root = DeployTests.root

    struct Verdict: Decodable {
        var file: String
        var valid: Bool
        var errors: [String]
    }

    static func validate(_ files: [String]) throws -> [Verdict] {
        try Prerequisite.require(PythonFixture.unavailable(modules: ["jsonschema", "yaml"]) == nil, "jsonschema and PyYAML in the tests' venv")
        let schema = root.appendingPathComponent("docs/configuration.schema.json").path
        let out = try PythonFixture.runClient(script: "validate_config.py", arguments: [schema] + files)
        return try out.split(separator: "\n").map { try JSONDecoder().decode(Verdict.self, from: Data($0.utf8)) }
    }

    @Test func commandPrintsTheCommittedSchema() throws {
        let out = try CommandLineTests.run(["config", "schema"])
        #expect(out.status == 0, "\(out.stderr)")
        let committed = try String(contentsOf: Self.root.appendingPathComponent("docs/configuration.schema.json"), encoding: .utf8)
        #expect(out.stdout == committed)
        let reference = try CommandLineTests.run(["config", "reference"])
        #expect(reference.status == 0)
        #expect(reference.stdout == (try String(contentsOf: Self.root.appendingPathComponent("docs/configuration.md"), encoding: .utf8)))
    }

    /// config.example.yaml, deploy/examples/*.yaml, deploy/kubernetes/keyless/bearerd.yaml and the
    /// bearerd.yaml of every ConfigMap under deploy/kubernetes.
    @Test func shippedConfigurationsAreValid() throws {
        let fm = FileManager.default
        var files = [Self.root.appendingPathComponent("config.example.yaml").path,
                     Self.root.appendingPathComponent("deploy/kubernetes/keyless/bearerd.yaml").path,
                     Self.root.appendingPathComponent("deploy/kubernetes/irsa/bearerd.yaml").path]
        for dir in ["deploy/examples", "deploy/kubernetes"] {
            let url = Self.root.appendingPathComponent(dir)
            files += try fm.contentsOfDirectory(atPath: url.path).filter { $0.hasSuffix(".yaml") }.sorted().map { url.appendingPathComponent($0).path }
        }
        let verdicts = try Self.validate(files)
        for v in verdicts { #expect(v.valid, "\(v.file): \(v.errors.joined(separator: "; "))") }
        #expect(verdicts.count >= files.count, "every standalone file and every ConfigMap")
        #expect(verdicts.filter { $0.file.contains("#ConfigMap/") }.count >= 3)
    }

    /// The configurations the documentation shows: every ```yaml block of README.md and
    /// docs/guides/*.md that is a whole configuration (top-level `routes:`, and `sessions:` when a
    /// route names a session) passes the schema
    /// and `bearerd check --example`. Blocks that show a part (one session, one key) are not
    /// configurations; at least the README's two and a guide's few are.
    @Test func documentedConfigurationsAreValid() throws {
        let fm = FileManager.default
        let guides = try fm.contentsOfDirectory(atPath: Self.root.appendingPathComponent("docs/guides").path)
            .filter { $0.hasSuffix(".md") }.sorted().map { "docs/guides/" + $0 }
        let scratch = fm.temporaryDirectory.appendingPathComponent("bearerd-doc-configs-\(UUID().uuidString)")
        try fm.createDirectory(at: scratch, withIntermediateDirectories: true)
        defer { try? fm.removeItem(at: scratch) }
        var files: [(path: String, origin: String)] = []
        for doc in ["README.md"] + guides {
            let text = try String(contentsOf: Self.root.appendingPathComponent(doc), encoding: .utf8)
            var block: [Substring]?
            var line = 0, start = 0
            for l in text.split(separator: "\n", omittingEmptySubsequences: false) {
                line += 1
                let t = l.trimmingCharacters(in: .whitespaces)
                if block == nil, t == "```yaml" { block = []; start = line; continue }
                guard var b = block else { continue }
                if t == "```" {
                    let yaml = b.joined(separator: "\n")
                    let lines = yaml.split(separator: "\n")
                    let whole = lines.contains { $0.hasPrefix("routes:") }
                        && (lines.contains { $0.hasPrefix("sessions:") } || !yaml.contains("session:"))
                    if whole {
                        let path = scratch.appendingPathComponent("\(files.count).yaml").path
                        try yaml.write(toFile: path, atomically: true, encoding: .utf8)
                        files.append((path, "\(doc):\(start)"))
                    }
                    block = nil
                    continue
                }
                b.append(l)
                block = b
            }
        }
        #expect(files.filter { $0.origin.hasPrefix("README.md") }.count >= 2, "the README's configurations: \(files.map(\.origin))")
        #expect(files.count >= 5, "\(files.map(\.origin))")
        let verdicts = try Self.validate(files.map(\.path))
        for (v, f) in zip(verdicts, files) { #expect(v.valid, "\(f.origin): \(v.errors.joined(separator: "; "))") }
        for f in files {
            let check = try CommandLineTests.run(["check", "--example", "-c", f.path])
            #expect(check.status == 0, "\(f.origin): \(check.stdout)\(check.stderr)")
        }
    }

    static let base = """
        listen: 127.0.0.1:8080
        loops: 2
        io: poller
        sessions:
          partner:
            grant: client_credentials
            token_url: https://auth.example.com/oauth2/token
            client_id: svc
            client_secret: s3cret
            refresh_before: 60s
        routes:
          - match: /
            upstream: https://api.example.com
            session: partner

        """

    /// (name, text to replace in `base`, replacement, the schema error's location)
    static let mistakes: [(String, String, String, String)] = [
        ("misspelled top key", "listen:", "listn:", ""),
        ("unknown session key", "    client_id: svc\n", "    client_id: svc\n    clientid: svc\n", "sessions/partner"),
        ("wrong type", "loops: 2", "loops: many", "loops"),
        ("bad enum", "io: poller", "io: epoll", "io"),
        ("bad duration", "refresh_before: 60s", "refresh_before: 5 minutes", "sessions/partner/refresh_before"),
        ("bad grant", "grant: client_credentials", "grant: client-credentials", "sessions/partner/grant"),
        ("unknown route key", "    session: partner", "    sesion: partner", "routes/0"),
    ]

    @Test func schemaRefusesWhatCheckRefuses() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("bearerd-schema-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let good = dir.appendingPathComponent("good.yaml").path
        try Self.base.write(toFile: good, atomically: true, encoding: .utf8)
        var files = [good]
        for (i, m) in Self.mistakes.enumerated() {
            let text = Self.base.replacingOccurrences(of: m.1, with: m.2)
            #expect(text != Self.base, "\(m.0): the replacement did not apply")
            let path = dir.appendingPathComponent("bad\(i).yaml").path
            try text.write(toFile: path, atomically: true, encoding: .utf8)
            files.append(path)
        }
        let verdicts = try Self.validate(files)
        try #require(verdicts.count == files.count)
        #expect(verdicts[0].valid, "the correct file: \(verdicts[0].errors)")
        let check = try CommandLineTests.run(["check", "-c", good])
        #expect(check.status == 0, "bearerd check refuses the correct file: \(check.stderr)")
        for (i, m) in Self.mistakes.enumerated() {
            let v = verdicts[i + 1]
            #expect(!v.valid, "the schema accepts a \(m.0)")
            #expect(v.errors.contains { $0.hasPrefix(m.3 + ":") }, "\(m.0): errors \(v.errors) do not point at \(m.3)")
            let refused = try CommandLineTests.run(["check", "-c", files[i + 1]])
            #expect(refused.status != 0, "bearerd check accepts a \(m.0)")
        }
    }
}
