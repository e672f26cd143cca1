import Foundation
import Testing
import BearerdTestSupport

/// The container image is built and tried, not only written: `deploy/container/build-image.sh`
/// builds it `FROM scratch` with podman (no registry), the test exports its file system and runs
/// the entrypoint inside it with `chroot` as the image's user (running containers does not work
/// on these machines): `--version`, `check` of a mounted config, and the demo answering curl.
///
/// Needs root (chroot, and podman installed by the script); CI runs as root. It builds bearerd in
/// release mode in `.build-image` (several minutes), so `.ci/run` runs it once, in the default
/// pass. A developer may set `BEARERD_SKIP_IMAGE=1` to leave it out of a local run.
@Suite("Container image", .serialized)
struct ContainerImageTests {
    static let root = QuickStartTests.root
    static var enabled: Bool {
        let env = ProcessInfo.processInfo.environment
        // Under CI it always runs, and fails without root (Prerequisite.require below).
        return Prerequisite.isCI || (Prerequisite.isRoot && env["BEARERD_SKIP_IMAGE"] == nil)
    }

    struct Run { let status: Int32; let out: String }

    static func run(_ executable: String, _ args: [String], cwd: URL? = nil) throws -> Run {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: executable)
        p.arguments = args
        if let cwd { p.currentDirectoryURL = cwd }
        let pipe = Pipe()
        p.standardOutput = pipe
        p.standardError = pipe
        try p.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return Run(status: p.terminationStatus, out: String(decoding: data, as: UTF8.self))
    }

    /// `chroot --userspec=65532:65532 ROOT ARGS…`: the entrypoint as the image's user.
    static func inImage(_ rootfs: URL, _ args: [String]) throws -> Run {
        try run("/usr/sbin/chroot", ["--userspec=65532:65532", rootfs.path] + args)
    }

    @Test(.enabled(if: enabled), .timeLimit(.minutes(30)))
    func theImageIsBuiltWithoutARegistryAndItsEntrypointServesTheDemo() throws {
        try Prerequisite.require(Prerequisite.isRoot, "root (chroot into the image, podman installed by the build script)")
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("bearerd-image-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: scratch) }
        let tag = "localhost/bearerd-test:\(getpid())"

        // Its own build folder: `swift test` holds .build's lock while it runs.
        let build = try Self.run("/usr/bin/env", ["BEARERD_SCRATCH=.build-image", "/bin/bash", "deploy/container/build-image.sh", tag], cwd: Self.root)
        try #require(build.status == 0, "build-image.sh failed:\n\(build.out)")
        defer { _ = try? Self.run("/usr/bin/podman", ["rmi", "-f", tag]) }
        let sizeLine = build.out.split(separator: "\n").last { $0.hasPrefix("image ") }.map(String.init) ?? ""
        print("container image: \(sizeLine)")
        let bytes = try #require(Self.run("/usr/bin/podman", ["image", "inspect", tag, "--format", "{{.Size}}"]).out
            .trimmingCharacters(in: .whitespacesAndNewlines)).split(separator: "\n").last.flatMap { Int($0) }
        // The goal is 30 MB; today Foundation's ICU data (which Yams needs) alone is ~37 MB of the
        // binary's read-only data. This bound catches a regression (a debug or unstripped build).
        #expect((bytes ?? .max) < 96 * 1024 * 1024, "image size \(bytes ?? -1)")

        // The image's file system, as a container would see it.
        let created = try Self.run("/usr/bin/podman", ["create", tag])
        try #require(created.status == 0, "\(created.out)")
        let container = created.out.split(separator: "\n").last.map(String.init) ?? ""
        defer { _ = try? Self.run("/usr/bin/podman", ["rm", "-f", container]) }
        let rootfs = scratch.appendingPathComponent("root")
        try FileManager.default.createDirectory(at: rootfs, withIntermediateDirectories: true)
        let tar = scratch.appendingPathComponent("image.tar").path
        let exported = try Self.run("/usr/bin/podman", ["export", "-o", tar, container])
        try #require(exported.status == 0, "\(exported.out)")
        let unpacked = try Self.run("/bin/tar", ["-x", "--same-owner", "-p", "-f", tar, "-C", rootfs.path])
        try #require(unpacked.status == 0, "\(unpacked.out)")
        // What a container runtime provides: /proc (the Swift runtime reads its arguments from
        // /proc/self/cmdline; without it every command sees none and prints the overview).
        let proc = rootfs.appendingPathComponent("proc").path
        let mounted = try Self.run("/bin/mount", ["-t", "proc", "proc", proc])
        try #require(mounted.status == 0, "mount proc: \(mounted.out)")
        defer { _ = try? Self.run("/bin/umount", ["-l", proc]) }

        // The image's metadata: a non-root user, the entrypoint, the config path.
        let config = try Self.run("/usr/bin/podman", ["image", "inspect", tag, "--format", "{{.Config.User}} {{json .Config.Entrypoint}} {{json .Config.Env}}"])
        #expect(config.out.contains("65532:65532"), "\(config.out)")
        #expect(config.out.contains("\"/usr/local/bin/bearerd\""), "\(config.out)")
        #expect(config.out.contains("BEARERD_CONFIG=/etc/bearerd/bearerd.yaml"), "\(config.out)")
        // state_dir belongs to the image's user, 0700; the binary is stripped.
        let state = try FileManager.default.attributesOfItem(atPath: rootfs.appendingPathComponent("var/lib/bearerd").path)
        #expect((state[.ownerAccountID] as? NSNumber)?.intValue == 65532)
        #expect(((state[.posixPermissions] as? NSNumber)?.intValue ?? 0) & 0o777 == 0o700)
        let symbols = try Self.run("/usr/bin/readelf", ["-S", rootfs.appendingPathComponent("usr/local/bin/bearerd").path])
        #expect(!symbols.out.contains(".symtab"), "the binary in the image is not stripped")

        // 1. --version as the image's user, with only the image's libraries.
        let version = try Self.inImage(rootfs, ["/usr/local/bin/bearerd", "--version"])
        #expect(version.status == 0, "\(version.out)")
        let versionLine = version.out.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(versionLine.split(separator: ".").count >= 2 && versionLine.first?.isNumber == true && !versionLine.contains(" "),
                "not a version: \(version.out)")

        // 2. check of a mounted config (a session whose secret is a mounted file, an https token
        //    endpoint verified with the image's CA store, state_dir on the image's volume).
        let etc = rootfs.appendingPathComponent("etc/bearerd")
        let secrets = rootfs.appendingPathComponent("run/secrets/bearerd")
        try FileManager.default.createDirectory(at: secrets, withIntermediateDirectories: true)
        try "s3cret\n".write(to: secrets.appendingPathComponent("partner"), atomically: true, encoding: .utf8)
        try """
        listen: [127.0.0.1:8080]
        admin: 127.0.0.1:9901
        state_dir: /var/lib/bearerd
        sessions:
          partner:
            grant: client_credentials
            token_url: https://auth.example.com/oauth2/token
            client_id: my-service
            client_secret_file: /run/secrets/bearerd/partner
        routes:
          - match: /
            upstream: https://api.example.com
            session: partner
        """.write(to: etc.appendingPathComponent("bearerd.yaml"), atomically: true, encoding: .utf8)
        _ = try Self.run("/bin/chmod", ["-R", "a+rX", etc.path, secrets.path])
        let check = try Self.inImage(rootfs, ["/usr/local/bin/bearerd", "check", "-c", "/etc/bearerd/bearerd.yaml"])
        #expect(check.status == 0, "\(check.out)")
        #expect(check.out.contains("/etc/bearerd/bearerd.yaml: OK (1 listener(s), 1 session(s), 1 route(s))"), "\(check.out)")

        // 3. the demo inside the image answers a curl from outside.
        let port = NginxOrigin.freePort(), upstreamPort = NginxOrigin.freePort(), adminPort = NginxOrigin.freePort()
        let demo = Process()
        demo.executableURL = URL(fileURLWithPath: "/usr/sbin/chroot")
        demo.arguments = ["--userspec=65532:65532", rootfs.path, "/usr/local/bin/bearerd", "demo",
                          "--port", "\(port)", "--upstream-port", "\(upstreamPort)", "--admin-port", "\(adminPort)"]
        let log = scratch.appendingPathComponent("demo.log")
        FileManager.default.createFile(atPath: log.path, contents: nil)
        let handle = try FileHandle(forWritingTo: log)
        demo.standardOutput = handle
        demo.standardError = handle
        try demo.run()
        defer {
            if demo.isRunning { kill(demo.processIdentifier, SIGTERM) }
            demo.waitUntilExit()
        }
        var body = ""
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline && demo.isRunning {
            let answer = QuickStartTests.curl(["http://127.0.0.1:\(port)/hello"])
            if answer.status == 0 && !answer.body.isEmpty { body = answer.body; break }
            usleep(100_000)
        }
        let logText = (try? String(contentsOf: log, encoding: .utf8)) ?? ""
        #expect(body.contains("fingerprint"), "the demo in the image did not answer: \(body)\n\(logText)")
    }
}
