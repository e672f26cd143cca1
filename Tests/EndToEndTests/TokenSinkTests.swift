import Foundation
import Testing
import BearerdTestSupport

/// Sink files (docs/architecture.md §4 `sinks:`) with the real binary and the Authlib fixture: atomic
/// rewrites watched by another process, every format for bearer, inject and DPoP sessions, an
/// unwritable directory (bearerd run as another uid), and a reload removing a sink.
@Suite("Token sinks", .serialized, .enabled(if: Prerequisite.runs(AuthServerFixture.isAvailable), "\(AuthServerFixture.unavailableReason ?? "")"))
struct TokenSinkTests {
    static func read(_ path: String) -> String? { try? String(contentsOfFile: path, encoding: .utf8) }

    static func mode(_ path: String) -> Int? {
        (try? FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int) ?? nil
    }

    static func jsonObject(_ text: String) -> [String: Any]? {
        (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any]
    }

    /// The value of the sample `series` (name and labels exactly as exposed) in a metrics text.
    static func metric(_ text: String, _ series: String) -> Double? {
        for line in text.split(separator: "\n") where line.hasPrefix(series + " ") {
            return Double(line.dropFirst(series.count + 1))
        }
        return nil
    }

    /// Waits until `condition` holds, polling every 20 ms, for at most `seconds`.
    static func wait(seconds: Double, _ condition: () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if condition() { return true }
            Thread.sleep(forTimeInterval: 0.02)
        }
        return condition()
    }

    static func echoOrigin() throws -> TestOrigin {
        try TestOrigin { r in .response(status: 200, headers: [("Content-Type", "text/plain")], body: Array((r.head.headers["Authorization"] ?? "-").utf8)) }
    }

    /// A python3 process that reads the files in a loop until `stop` exists (at most 120 s) and
    /// prints `{"reads", "bad", "distinct"}`: a read is bad when a file is missing, empty, not
    /// one newline-terminated line (`.token`: not exactly the token, without a line ending), or
    /// (`.json`) not the 4-key JSON object.
    static let readerScript = #"""
    import json, os, sys, time
    stop, files = sys.argv[1], sys.argv[2:]
    reads, bad, seen = 0, [], set()
    deadline = time.monotonic() + 120
    while not os.path.exists(stop) and time.monotonic() < deadline:
        for f in files:
            try:
                with open(f, "rb") as h:
                    data = h.read()
            except FileNotFoundError:
                bad.append([f, "missing"]); continue
            reads += 1
            text = data.decode("utf-8", "replace")
            # `.token` files hold exactly the token; the others one newline-terminated line.
            if f.endswith(".token"):
                if not text or "\n" in text or "\r" in text:
                    bad.append([f, repr(text)]); continue
            elif not text or not text.endswith("\n") or text.count("\n") != 1:
                bad.append([f, repr(text)]); continue
            if f.endswith(".json"):
                try:
                    o = json.loads(text)
                    assert set(o) == {"access_token", "token_type", "expires_at", "session"}
                    seen.add(o["access_token"])
                except Exception as e:
                    bad.append([f, "json: %s" % e])
    print(json.dumps({"reads": reads, "bad": bad[:20], "distinct": len(seen)}))
    """#

    @Test func aSinkRewrittenAcross20RefreshesIsNeverSeenPartialByAnotherProcess() throws {
        let auth = try AuthServerFixture.start(tokenLifetime: 2)
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("sinks-refresh")
        let sinkDir = dir + "/out/sub"   // missing: created 0750
        let port = try RunningBearerd.freePort()
        let cfg = """
            listen: [127.0.0.1:\(port)]
            sessions:
              b:
                grant: client_credentials
                token_url: \(auth.tokenURL)
                client_id: svc
                client_secret: svc-secret
                sinks:
                  - { path: \(sinkDir)/b.json, format: json }
                  - { path: \(sinkDir)/b.token, mode: 0660, format: token }
            routes:
              - match: /
                upstream: http://127.0.0.1:9
                session: b
            """
        let b = try RunningBearerd(config: cfg, dir: dir)
        defer { _ = b.stop() }
        #expect(Self.wait(seconds: 15) { Self.read(sinkDir + "/b.json") != nil }, "\(b.logs)")

        let stop = dir + "/stop-reader"
        let script = dir + "/reader.py"
        try Self.readerScript.write(toFile: script, atomically: true, encoding: .utf8)
        let reader = Process()
        reader.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        reader.arguments = [script, stop, sinkDir + "/b.json", sinkDir + "/b.token"]
        let out = Pipe()
        reader.standardOutput = out
        try reader.run()

        // This test's own view: 21 different tokens pass through the file (20 refreshes).
        var seen: Set<String> = []
        let refreshed = Self.wait(seconds: 90) {
            if let t = Self.read(sinkDir + "/b.json").flatMap(Self.jsonObject)?["access_token"] as? String { seen.insert(t) }
            return seen.count >= 21
        }
        _ = FileManager.default.createFile(atPath: stop, contents: nil)
        let result = out.fileHandleForReading.readDataToEndOfFile()
        reader.waitUntilExit()
        #expect(refreshed, "only \(seen.count) tokens seen: \(b.logs.suffix(2000))")
        let report = try #require(Self.jsonObject(String(decoding: result, as: UTF8.self)))
        #expect((report["bad"] as? [Any])?.isEmpty == true, "partial or empty reads: \(report)")
        #expect((report["reads"] as? Int ?? 0) > 200, "\(report)")
        #expect((report["distinct"] as? Int ?? 0) >= 15, "the reader saw the rewrites: \(report)")

        _ = b.stop()  // so no write is in progress while the directory is listed
        // Modes applied exactly (0660 survives the umask of 022), the directory created 0750,
        // owner the process's (root here), and no temp files left behind.
        #expect(Self.mode(sinkDir + "/b.token") == 0o660)
        #expect(Self.mode(sinkDir + "/b.json") == 0o640)
        #expect(Self.mode(sinkDir) == 0o750)
        #expect(Self.mode(dir + "/out") == 0o750)
        let attrs = try FileManager.default.attributesOfItem(atPath: sinkDir + "/b.json")
        #expect((attrs[.ownerAccountID] as? Int) == Int(getuid()))
        let left = try FileManager.default.contentsOfDirectory(atPath: sinkDir)
        #expect(Set(left) == ["b.json", "b.token"], "\(left)")
        // The token file holds the same token as the JSON one (one rewrite per token).
        let token = Self.read(sinkDir + "/b.token")
        let fromJSON = Self.read(sinkDir + "/b.json").flatMap(Self.jsonObject)?["access_token"] as? String
        #expect(token != nil && fromJSON != nil)
        // Tokens are never logged (fingerprints only).
        for t in seen { #expect(!b.logs.contains(t)) }
    }

    @Test func everyFormatForBearerInjectAndDPoPSessions() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        // A second server for the DPoP session (DPoP on: it demands proofs from every client).
        let dpopAuth = try AuthServerFixture.start()
        defer { dpopAuth.stop() }
        #expect(try dpopAuth.request("POST", "/_test/dpop?enable=1&nonce=1").status == 200)
        let origin = try Self.echoOrigin()
        defer { origin.stop() }
        let dir = try RunningBearerd.tempDir("sinks-formats")
        let port = try RunningBearerd.freePort()
        func sinks(_ s: String) -> String {
            (["    sinks:"] + ["token", "header", "json"].map { "      - { path: \(dir)/sinks/\(s).\($0), format: \($0) }" })
                .joined(separator: "\n")
        }
        let cfg = """
            listen: [127.0.0.1:\(port)]
            state_dir: \(dir)/state
            sessions:
              bearer:
                grant: client_credentials
                token_url: \(auth.tokenURL)
                client_id: svc
                client_secret: svc-secret
            \(sinks("bearer"))
              inject:
                grant: client_credentials
                token_url: \(auth.tokenURL)
                client_id: svc-post
                client_secret: post-secret
                client_auth: client_secret_post
            \(sinks("inject"))
              dpop:
                grant: client_credentials
                token_url: \(dpopAuth.tokenURL)
                client_id: svc
                client_secret: svc-secret
                dpop: true
            \(sinks("dpop"))
            routes:
              - match: /bearer/
                upstream: http://127.0.0.1:\(origin.port)
                session: bearer
              - match: /inject/
                upstream: http://127.0.0.1:\(origin.port)
                session: inject
                inject: { header: X-Api-Key, format: "key={token};" }
              - match: /dpop/
                upstream: http://127.0.0.1:\(origin.port)
                session: dpop
            """
        let before = Int64(Date().timeIntervalSince1970)
        let b = try RunningBearerd(config: cfg, dir: dir)
        defer { _ = b.stop() }
        let expected: [(session: String, header: (String) -> String, type: String)] = [
            ("bearer", { "Authorization: Bearer \($0)" }, "Bearer"),
            ("inject", { "X-Api-Key: key=\($0);" }, "Bearer"),
            ("dpop", { "Authorization: DPoP \($0)" }, "DPoP"),
        ]
        for e in expected {
            let base = dir + "/sinks/" + e.session
            #expect(Self.wait(seconds: 15) { [".token", ".header", ".json"].allSatisfy { Self.read(base + $0) != nil } }, "\(e.session): \(b.logs)")
            let token = try #require(Self.read(base + ".token"))
            // Exactly the token: the bytes a consumer reads go straight into a header value.
            #expect(!token.contains("\n") && !token.contains("\r") && token.count > 10, "\(token.debugDescription)")
            let value = token
            #expect(Self.read(base + ".header") == e.header(value) + "\n")
            let jsonText = try #require(Self.read(base + ".json"))
            #expect(jsonText.hasPrefix("{\"access_token\":") && jsonText.hasSuffix("}\n"))
            let o = try #require(Self.jsonObject(jsonText))
            #expect(o.count == 4)
            #expect(o["access_token"] as? String == value)
            #expect(o["token_type"] as? String == e.type)
            #expect(o["session"] as? String == e.session)
            let expiresAt = try TokenFormatCommandTests.seconds(try #require(o["expires_at"] as? String))
            let after = Int64(Date().timeIntervalSince1970)
            #expect(expiresAt >= before + 3600 - 1 && expiresAt <= after + 3600, "\(e.session): the token's real expiry \(expiresAt)")
            #expect(Self.mode(base + ".token") == 0o640)
            #expect(!b.logs.contains(value))
        }
        // The bearer sink holds the token the proxy sends, and the fixture accepts it.
        let viaProxy = try TestClient.get(port: port, path: "/bearer/x")
        #expect(viaProxy.bodyText == "Bearer " + (try #require(Self.read(dir + "/sinks/bearer.token"))))
        let api = try TestClient.get(port: auth.port, path: "/api/x",
                                     headers: [("Authorization", try #require(Self.read(dir + "/sinks/bearer.header")).dropFirst("Authorization: ".count).trimmingCharacters(in: .newlines))])
        #expect(api.status == 200, "\(api.bodyText)")
    }

    @Test(.enabled(if: Prerequisite.runs(Prerequisite.isRoot), "runs bearerd as uid 65534 (setpriv), which needs root"))
    func anUnwritableSinkDirectoryKeepsTheProxyServingShowsOnReadyzAndRecovers() throws {
        try Prerequisite.require(Prerequisite.isRoot, "root (bearerd run as uid 65534 with setpriv)")
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let origin = try Self.echoOrigin()
        defer { origin.stop() }
        let dir = try RunningBearerd.tempDir("sinks-unwritable")
        // bearerd runs as nobody (65534): root ignores permissions, nobody does not.
        let sinkDir = dir + "/locked"
        try FileManager.default.createDirectory(atPath: sinkDir, withIntermediateDirectories: false)
        #expect(chown(sinkDir, 65534, 65534) == 0)
        #expect(chmod(sinkDir, 0o500) == 0)
        #expect(chmod(dir, 0o755) == 0)
        let port = try RunningBearerd.freePort()
        let admin = try RunningBearerd.freePort()
        let cfg = """
            listen: [127.0.0.1:\(port)]
            admin: 127.0.0.1:\(admin)
            sessions:
              b:
                grant: client_credentials
                token_url: \(auth.tokenURL)
                client_id: svc
                client_secret: svc-secret
                sinks:
                  - { path: \(sinkDir)/b.token, format: token }
            routes:
              - match: /
                upstream: http://127.0.0.1:\(origin.port)
                session: b
            """
        let b = try RunningBearerd(config: cfg, dir: dir, wrapper: ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"])
        defer { _ = b.stop() }
        let served = try #require(b.waitServing(port: port, path: "/x"), "\(b.logs)")
        #expect(served.status == 200, "\(served.bodyText) \(b.logs)")
        #expect(served.bodyText.hasPrefix("Bearer "))

        // Readiness stays 200 with the sink under "degraded"; the metrics count the failures.
        var ready: TestClient.Response?
        #expect(Self.wait(seconds: 15) {
            ready = try? TestClient.get(port: admin, path: "/readyz")
            return ready?.bodyText.contains("sink_failing") == true
        }, "\(ready?.bodyText ?? "-") \(b.logs)")
        #expect(ready?.status == 200)
        let body = try #require(ready.flatMap { Self.jsonObject($0.bodyText) })
        #expect(body["status"] as? String == "ready")
        let degraded = try #require((body["degraded"] as? [[String: Any]])?.first)
        #expect(degraded["session"] as? String == "b")
        #expect(degraded["path"] as? String == sinkDir + "/b.token")
        #expect((degraded["detail"] as? String ?? "").contains("Permission denied"), "\(degraded)")
        // Retried with backoff: a second failure is counted.
        var metrics = ""
        #expect(Self.wait(seconds: 15) {
            metrics = (try? TestClient.get(port: admin, path: "/metrics").bodyText) ?? ""
            return (Self.metric(metrics, "bearerd_sink_write_failures_total{session=\"b\",path=\"\(sinkDir)/b.token\"}") ?? 0) >= 2
        }, "\(metrics)")
        #expect(Self.metric(metrics, "bearerd_sinks_failing{session=\"b\"}") == 1, "\(metrics)")
        #expect(b.logs.contains("cannot write a sink file"))
        #expect(try TestClient.get(port: port, path: "/y").status == 200)

        // The directory becomes writable: the next retry writes the file, all is well again.
        #expect(chmod(sinkDir, 0o700) == 0)
        #expect(Self.wait(seconds: 30) { Self.read(sinkDir + "/b.token") != nil }, "\(b.logs)")
        let token = try #require(Self.read(sinkDir + "/b.token"))
        #expect(try TestClient.get(port: port, path: "/z").bodyText == "Bearer " + token)
        let attrs = try FileManager.default.attributesOfItem(atPath: sinkDir + "/b.token")
        #expect((attrs[.ownerAccountID] as? Int) == 65534)
        #expect((attrs[.groupOwnerAccountID] as? Int) == 65534)
        #expect(Self.wait(seconds: 5) {
            let r = try? TestClient.get(port: admin, path: "/readyz")
            return r?.status == 200 && r?.bodyText == "{\"status\":\"ready\"}\n"
        })
        metrics = (try? TestClient.get(port: admin, path: "/metrics").bodyText) ?? ""
        #expect(Self.metric(metrics, "bearerd_sinks_failing{session=\"b\"}") == 0, "\(metrics)")
        #expect((Self.metric(metrics, "bearerd_sink_writes_total{session=\"b\",path=\"\(sinkDir)/b.token\"}") ?? 0) >= 1)
        #expect(b.waitLog("sink written again after failures"), "\(b.logs)")
    }

    @Test func aReloadRemovingASinkStopsWritingItAndLeavesTheFile() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("sinks-reload")
        let port = try RunningBearerd.freePort()
        func cfg(_ sinks: [(String, String)]) -> String {
            """
            listen: [127.0.0.1:\(port)]
            sessions:
              b:
                grant: client_credentials
                token_url: \(auth.tokenURL)
                client_id: svc
                client_secret: svc-secret
                sinks:
            \(sinks.map { "          - { path: \(dir)/\($0.0), format: \($0.1) }" }.joined(separator: "\n"))
            routes:
              - match: /
                upstream: http://127.0.0.1:\(auth.port)
                session: b
            """
        }
        let b = try RunningBearerd(config: cfg([("kept", "token"), ("removed", "token")]), dir: dir)
        defer { _ = b.stop() }
        #expect(Self.wait(seconds: 15) { Self.read(dir + "/kept") != nil && Self.read(dir + "/kept") == Self.read(dir + "/removed") }, "\(b.logs)")
        let first = try #require(Self.read(dir + "/removed"))

        // kept changes format, removed goes, added is new: both written at once with the
        // current token (tokens last an hour here: no refresh happens meanwhile).
        try b.rewrite(cfg([("kept", "header"), ("added", "json")]))
        b.signal(SIGHUP)
        #expect(b.waitLog("configuration reloaded"), "\(b.logs)")
        #expect(Self.wait(seconds: 5) {
            Self.read(dir + "/kept") == "Authorization: Bearer \(first)\n"
                && (Self.read(dir + "/added").flatMap(Self.jsonObject)?["access_token"] as? String) == first
        }, "\(Self.read(dir + "/kept") ?? "-") \(b.logs)")
        #expect(b.logs.contains("sink removed; its file is left as it is"))

        // A new token (the upstream revoked the old one: refresh and replay) reaches the sinks
        // configured now; the removed one keeps what it had.
        #expect(try auth.request("POST", "/_test/revoke-all").status == 200)
        let r = try TestClient.get(port: port, path: "/api/x")
        #expect(r.status == 200, "\(r.bodyText) \(b.logs)")
        var second = ""
        #expect(Self.wait(seconds: 10) {
            second = (Self.read(dir + "/added").flatMap(Self.jsonObject)?["access_token"] as? String) ?? first
            return second != first && Self.read(dir + "/kept") == "Authorization: Bearer \(second)\n"
        }, "\(b.logs)")
        #expect(Self.read(dir + "/removed") == first)
    }
}
