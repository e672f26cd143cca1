import Foundation
import Testing
import BearerdProxy
import BearerdConfig
import BearerdSessions
import BearerdService

/// The files under deploy/: the systemd units pass `systemd-analyze verify` and keep their
/// `systemd-analyze security` exposure (docs/guides/systemd.md quotes it); the Kubernetes example's
/// bearerd.yaml is a valid configuration whose secret path lies on the Secret volume.
@Suite("deploy/")
struct DeployTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let analyze = "/usr/bin/systemd-analyze"
    /// CI installs Debian's systemd package (.ci/run); elsewhere the systemd checks need it too.
    static var haveAnalyze: Bool {
        FileManager.default.isExecutableFile(atPath: analyze) || ProcessInfo.processInfo.environment["CI"] != nil
    }

    static func read(_ relative: String) throws -> String {
        try String(contentsOf: root.appendingPathComponent(relative), encoding: .utf8)
    }

    static func run(_ executable: String, _ args: [String], cwd: URL? = nil) throws -> CommandLineTests.Output {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable)
        p.arguments = args
        if let cwd { p.currentDirectoryURL = cwd }
        let out = Pipe(), err = Pipe()
        p.standardOutput = out
        p.standardError = err
        try p.run()
        let o = out.fileHandleForReading.readDataToEndOfFile()
        let e = err.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return CommandLineTests.Output(status: p.terminationStatus, stdout: String(decoding: o, as: UTF8.self),
                                       stderr: String(decoding: e, as: UTF8.self))
    }

    /// Both units in a scratch directory, ExecStart pointed at the built binary (verify insists
    /// that it exists).
    static func unitsInScratchDirectory() throws -> URL {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("bearerd-units-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let service = try read("deploy/systemd/bearerd.service")
            .replacingOccurrences(of: "ExecStart=/usr/local/bin/bearerd", with: "ExecStart=\(CommandLineTests.binary)")
        try service.write(to: dir.appendingPathComponent("bearerd.service"), atomically: true, encoding: .utf8)
        try read("deploy/systemd/bearerd.socket").write(to: dir.appendingPathComponent("bearerd.socket"), atomically: true, encoding: .utf8)
        return dir
    }

    /// `Key=value` settings of a unit file (last one wins, comments skipped).
    static func settings(_ unit: String) -> [String: String] {
        var s: [String: String] = [:]
        for line in unit.split(separator: "\n") where !line.hasPrefix("#") && !line.hasPrefix("[") {
            guard let eq = line.firstIndex(of: "=") else { continue }
            s[String(line[..<eq])] = String(line[line.index(after: eq)...])
        }
        return s
    }

    @Test(.enabled(if: haveAnalyze))
    func unitsAreCleanUnderSystemdAnalyzeVerify() throws {
        let dir = try Self.unitsInScratchDirectory()
        defer { try? FileManager.default.removeItem(at: dir) }
        let r = try Self.run(Self.analyze, ["verify", dir.appendingPathComponent("bearerd.service").path,
                                            dir.appendingPathComponent("bearerd.socket").path], cwd: dir)
        #expect(r.status == 0, "\(r.stderr)")
        #expect(r.stderr.isEmpty, "systemd-analyze verify printed: \(r.stderr)")
    }

    @Test(.enabled(if: haveAnalyze))
    func securityExposureIsLowAndQuotedInTheReadme() throws {
        let dir = try Self.unitsInScratchDirectory()
        defer { try? FileManager.default.removeItem(at: dir) }
        // --threshold is the exposure times ten: 20 = "2.0"; above it the command fails.
        let r = try Self.run(Self.analyze, ["security", "--offline=true", "--threshold=20", "--no-pager",
                                            dir.appendingPathComponent("bearerd.service").path], cwd: dir)
        let text = r.stdout + r.stderr
        #expect(r.status == 0, "\(text)")
        let line = try #require(text.split(separator: "\n").first { $0.contains("Overall exposure level for bearerd.service:") })
        let score = try #require(line.split(separator: " ").compactMap { Double($0) }.first)
        #expect(score <= 2.0)
        let guide = try Self.read("docs/guides/systemd.md")
        #expect(guide.contains("exposure level \(String(format: "%.1f", score))"), "docs/guides/systemd.md quotes the current score (\(score))")
    }

    @Test func serviceUnitSettings() throws {
        let s = Self.settings(try Self.read("deploy/systemd/bearerd.service"))
        #expect(s["Type"] == "notify")
        #expect(s["NotifyAccess"] == "main")
        #expect(s["DynamicUser"] == "yes")
        #expect(s["StateDirectory"] == "bearerd")
        #expect(s["CapabilityBoundingSet"] == "")
        #expect(s["ExecReload"] == "/bin/kill -HUP $MAINPID")
        #expect(s["LoadCredential"]?.hasPrefix("partner:") == true)
        // TimeoutStopSec must exceed the default shutdown_grace, or systemd kills a drain.
        let stop = try #require(s["TimeoutStopSec"].flatMap { Int($0.dropLast()) })
        #expect(Duration.seconds(stop) > FrontendTimeouts().shutdownGrace)
        let start = try #require(s["TimeoutStartSec"].flatMap { Int($0.dropLast()) })
        #expect(Duration.seconds(start) > BearerdConfig(file: "", listen: []).startupTimeout)
        #expect(s["WatchdogSec"] != nil)
        let socket = Self.settings(try Self.read("deploy/systemd/bearerd.socket"))
        #expect(socket["ListenStream"] == "127.0.0.1:8080")
        #expect(socket["FileDescriptorName"] == "api")
    }

    @Test func kubernetesSidecarConfigIsValid() throws {
        let manifest = try Self.read("deploy/kubernetes/sidecar.yaml")
        // The ConfigMap's `bearerd.yaml: |` block, de-indented.
        let lines = manifest.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        let start = try #require(lines.firstIndex { $0.trimmingCharacters(in: .whitespaces) == "bearerd.yaml: |" })
        var block: [String] = []
        for line in lines[(start + 1)...] {
            if !line.isEmpty && !line.hasPrefix("    ") { break }
            block.append(String(line.dropFirst(min(4, line.count))))
        }
        let config = try ConfigLoader.parse(yaml: block.joined(separator: "\n"), file: "sidecar.yaml", environment: [:], checkFiles: false)
        let secret = try #require(config.sessions.first?.clientSecret)
        guard case .file(let path) = secret else {
            Issue.record("the sidecar's client secret should come from the Secret volume, got \(secret)")
            return
        }
        #expect(manifest.contains("mountPath: \((path as NSString).deletingLastPathComponent)"), "the secret file lies on a mounted volume")
        let admin = try #require(config.admin)
        guard case .tcp(_, let adminPort) = admin else { Issue.record("admin on TCP"); return }
        #expect(manifest.contains("containerPort: \(adminPort)"))
        #expect(manifest.contains("path: /healthz") && manifest.contains("path: /readyz"))
        #expect(manifest.contains("readinessProbe:") && manifest.contains("livenessProbe:"))
    }

    /// No manifest puts `state_dir` at a volume's mount point: an emptyDir's root is owned by
    /// root with mode 0777, which bearerd refuses as a state_dir (anyone could plant files there);
    /// a directory inside it is created 0700 by bearerd itself.
    @Test func kubernetesStateDirectoriesLieInsideTheirVolumes() throws {
        let dir = Self.root.appendingPathComponent("deploy/kubernetes")
        let files = try FileManager.default.contentsOfDirectory(atPath: dir.path).filter { $0.hasSuffix(".yaml") }
        var checked = 0
        for file in files {
            let text = try Self.read("deploy/kubernetes/" + file)
            func values(_ key: String) -> [String] {
                text.split(separator: "\n").compactMap { line in
                    guard let r = line.range(of: key + ": ") else { return nil }
                    return line[r.upperBound...].split(whereSeparator: { $0 == " " || $0 == "}" || $0 == "," }).first.map(String.init)
                }
            }
            let mounts = Set(values("mountPath"))
            for stateDir in values("state_dir") {
                checked += 1
                #expect(!mounts.contains(stateDir), "\(file): state_dir \(stateDir) is a mount point")
                #expect(mounts.contains((stateDir as NSString).deletingLastPathComponent), "\(file): state_dir \(stateDir) lies on no volume")
            }
        }
        #expect(checked >= 3)
        // And bearerd does refuse a world-writable state_dir (what an emptyDir root is).
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("bearerd-emptydir-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(at: scratch) }
        chmod(scratch.path, 0o777)
        #expect(throws: StateStoreError.self) { try StateDirectory.check(scratch.path) }
        #expect(throws: Never.self) { try StateDirectory.check(scratch.path + "/state") }
    }

    /// The keyless sidecar (jwt_bearer → token_exchange, a projected service-account token):
    /// its bearerd.yaml passes `check --example` (the token file is a note), the ConfigMap holds
    /// the same text, and the projected volume delivers the file the config names.
    @Test func kubernetesKeylessSidecarPassesCheckExample() throws {
        let path = Self.root.appendingPathComponent("deploy/kubernetes/keyless/bearerd.yaml").path
        let out = try CommandLineTests.run(["check", "--example", "-c", path])
        #expect(out.status == 0, "\(out.stdout)\(out.stderr)")
        #expect(out.stdout.contains("sessions.workload.assertion_file: cannot read /var/run/secrets/tokens/sts"), "\(out.stdout)")
        let config = try ConfigLoader.parse(yaml: try Self.read("deploy/kubernetes/keyless/bearerd.yaml"), file: "bearerd.yaml", environment: [:], checkFiles: false)
        #expect(config.sessions.allSatisfy { $0.clientSecret == nil })
        #expect(config.sessions.first { $0.name == "api" }?.exchange?.subjectSession == "workload")
        let manifest = try Self.read("deploy/kubernetes/keyless-sidecar.yaml")
        let lines = manifest.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        let start = try #require(lines.firstIndex { $0.trimmingCharacters(in: .whitespaces) == "bearerd.yaml: |" })
        var block: [String] = []
        for line in lines[(start + 1)...] {
            if !line.isEmpty && !line.hasPrefix("    ") { break }
            block.append(String(line.dropFirst(min(4, line.count))))
        }
        let embedded = try ConfigLoader.parse(yaml: block.joined(separator: "\n"), file: "keyless-sidecar.yaml", environment: [:], checkFiles: false)
        // Lines differ (the ConfigMap adds a header), the settings do not.
        #expect(embedded.sessions.map { var s = $0; s.line = 0; return s } == config.sessions.map { var s = $0; s.line = 0; return s },
                "the ConfigMap differs from keyless/bearerd.yaml")
        #expect(embedded.routes.map { "\($0.match) \($0.upstream) \($0.session ?? "")" } == config.routes.map { "\($0.match) \($0.upstream) \($0.session ?? "")" })
        #expect(manifest.contains("serviceAccountToken:") && manifest.contains("audience: https://sts.example.com")
                && manifest.contains("expirationSeconds:") && manifest.contains("path: sts"))
        #expect(manifest.contains("mountPath: /var/run/secrets/tokens"))
        #expect(!manifest.contains("kind: Secret"))
    }

    /// The IRSA sidecar (grant aws, web_identity, a sign: route to S3): its bearerd.yaml passes
    /// `check --example`, the ConfigMap holds the same settings, the service account carries the
    /// role the config assumes, nothing holds a key, and state_dir lies inside the emptyDir
    /// (bearerd refuses a directory it does not own, as an emptyDir's root is).
    @Test func kubernetesIRSASidecarPassesCheckExample() throws {
        let path = Self.root.appendingPathComponent("deploy/kubernetes/irsa/bearerd.yaml").path
        let out = try CommandLineTests.run(["check", "--example", "-c", path])
        #expect(out.status == 0, "\(out.stdout)\(out.stderr)")
        let config = try ConfigLoader.parse(yaml: try Self.read("deploy/kubernetes/irsa/bearerd.yaml"), file: "bearerd.yaml", environment: [:], checkFiles: false)
        let session = try #require(config.sessions.first)
        #expect(session.grant == .aws)
        guard case .webIdentity(let w)? = session.signing?.source else {
            Issue.record("the IRSA session should use web_identity, got \(String(describing: session.signing?.source))")
            return
        }
        #expect(w.tokenFile == "/var/run/secrets/eks.amazonaws.com/serviceaccount/token")
        #expect(config.routes.first?.sign?.service == "s3")
        let manifest = try Self.read("deploy/kubernetes/irsa-sidecar.yaml")
        #expect(manifest.contains("eks.amazonaws.com/role-arn: \"\(w.roleARN)\""), "the service account names the role bearerd assumes")
        let lines = manifest.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        let start = try #require(lines.firstIndex { $0.trimmingCharacters(in: .whitespaces) == "bearerd.yaml: |" })
        var block: [String] = []
        for line in lines[(start + 1)...] {
            if !line.isEmpty && !line.hasPrefix("    ") { break }
            block.append(String(line.dropFirst(min(4, line.count))))
        }
        let embedded = try ConfigLoader.parse(yaml: block.joined(separator: "\n"), file: "irsa-sidecar.yaml", environment: [:], checkFiles: false)
        #expect(embedded.sessions.map { var s = $0; s.line = 0; return s } == config.sessions.map { var s = $0; s.line = 0; return s },
                "the ConfigMap differs from irsa/bearerd.yaml")
        #expect(embedded.routes.map { "\($0.match) \($0.upstream) \($0.session ?? "") \($0.sign?.service ?? "")" }
                == config.routes.map { "\($0.match) \($0.upstream) \($0.session ?? "") \($0.sign?.service ?? "")" })
        #expect(embedded.stateDir == config.stateDir)
        let stateDir = try #require(config.stateDir)
        #expect(manifest.contains("mountPath: \((stateDir as NSString).deletingLastPathComponent)}"), "state_dir is a directory inside the emptyDir mount")
        #expect(!manifest.contains("kind: Secret") && !manifest.contains("access_key_id_file"))
    }

    @Test func containerfileIsMultiStageAndRunsAsNonRoot() throws {
        let file = try Self.read("deploy/container/Containerfile")
        let froms = file.split(separator: "\n").filter { $0.hasPrefix("FROM ") }
        #expect(froms.count == 2)
        #expect(froms.first?.hasPrefix("FROM swift:6.") == true)
        #expect(froms.last?.hasPrefix("FROM debian:12-slim") == true)
        for package in ["libssl3", "libnghttp2-14", "ca-certificates"] { #expect(file.contains(package)) }
        let user = try #require(file.split(separator: "\n").last { $0.hasPrefix("USER ") })
        #expect(!user.contains("root") && !user.hasSuffix(" 0") && !user.contains(" 0:"))
    }
}
