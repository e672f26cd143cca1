import Foundation
import Testing

/// bearerd(1): `docs/man/bearerd.1` is generated from the command-line parser (swift-argument-parser's
/// manual plugin, docs/man/README.md) and installed by `deploy/install.sh`. The page must still
/// describe the parser as built: every subcommand and every option the binary's own
/// `--experimental-dump-help` lists appears in it, so a new flag without a regenerated page fails.
@Suite("bearerd(1)")
struct ManualPageTests {
    static let page = "docs/man/bearerd.1"

    /// (subcommand path, long option names) from the binary's help dump.
    static func parserOptions() throws -> [(command: String, options: [String])] {
        let dump = try CommandLineTests.run(["--experimental-dump-help"])
        #expect(dump.status == 0, "\(dump.stderr)")
        let json = try #require(try JSONSerialization.jsonObject(with: Data(dump.stdout.utf8)) as? [String: Any])
        var out: [(String, [String])] = []
        func walk(_ command: [String: Any], _ path: String) {
            let args = command["arguments"] as? [[String: Any]] ?? []
            let longs = args.flatMap { arg -> [String] in
                guard arg["shouldDisplay"] as? Bool ?? true else { return [] }
                return (arg["names"] as? [[String: Any]] ?? []).compactMap { $0["kind"] as? String == "long" ? $0["name"] as? String : nil }
            }
            out.append((path, longs))
            for sub in command["subcommands"] as? [[String: Any]] ?? [] where sub["shouldDisplay"] as? Bool ?? true {
                let name = sub["commandName"] as? String ?? "?"
                if name == "help" { continue }
                walk(sub, path.isEmpty ? name : path + " " + name)
            }
        }
        walk(try #require(json["command"] as? [String: Any]), "")
        return out
    }

    @Test func pageDescribesEverySubcommandAndOption() throws {
        let text = try DeployTests.read(Self.page)
        #expect(text.contains(".Dt BEARERD 1"))
        let commands = try Self.parserOptions()
        #expect(commands.count >= 7, "run, check, token, login, demo, config and its subcommands")
        for (command, options) in commands {
            if let last = command.split(separator: " ").last {
                #expect(text.contains(".It Em \(last)"), "subcommand \(command) is missing from \(Self.page): regenerate it (docs/man/README.md)")
            }
            for option in options {
                // `.It Fl -name`, or `.It Fl c , -name` for an option with a short name too.
                #expect(text.contains("Fl -\(option)") || text.contains(" , -\(option)"), "option --\(option) of '\(command)' is missing from \(Self.page): regenerate it (docs/man/README.md)")
            }
        }
    }

    @Test func installScriptInstallsTheBinaryAndThePageThatManRenders() throws {
        let stage = FileManager.default.temporaryDirectory.appendingPathComponent("bearerd-install-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: stage) }
        let r = try DeployTests.run("/bin/bash", ["deploy/install.sh", "--destdir", stage.path, "--binary", CommandLineTests.binary, "--systemd"],
                                    cwd: DeployTests.root)
        #expect(r.status == 0, "\(r.stdout)\(r.stderr)")
        let bin = stage.path + "/usr/local/bin/bearerd"
        let man = stage.path + "/usr/local/share/man/man1/bearerd.1"
        #expect(FileManager.default.isExecutableFile(atPath: bin))
        for f in [man, stage.path + "/etc/systemd/system/bearerd.service", stage.path + "/etc/bearerd/bearerd.yaml.example"] {
            let mode = (try FileManager.default.attributesOfItem(atPath: f)[.posixPermissions] as? NSNumber)?.intValue
            #expect(mode == 0o644, "\(f)")
        }
        let version = try DeployTests.run(bin, ["--version"])
        #expect(version.status == 0)
        // man(1) renders the installed page (Debian's man-db and groff-base, installed by .ci/run).
        let rendered = try DeployTests.run("/usr/bin/man", ["-l", "-P", "cat", man])
        #expect(rendered.status == 0, "\(rendered.stderr)")
        #expect(rendered.stdout.contains("bearerd") && rendered.stdout.contains("SYNOPSIS"), "\(rendered.stdout.prefix(400))")
    }
}
