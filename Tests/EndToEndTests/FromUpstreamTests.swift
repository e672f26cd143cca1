import Foundation
import Testing
import BearerdTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// `issuer: from_upstream` (RFC 9728, docs/architecture.md §6.16) with the real `bearerd` binary:
/// the upstream (Tests/Fixtures/protected_resource.py) names its authorization server (the
/// Authlib fixture) in its protected resource metadata; bearerd takes it only from
/// `allowed_issuers`, asks for tokens with `resource` = the upstream, and sends nothing to an
/// authorization server outside the list (a recording server proves it).
@Suite("issuer: from_upstream (RFC 9728)", .serialized, .enabled(if: Prerequisite.runs(AuthServerFixture.isAvailable), "\(AuthServerFixture.unavailableReason ?? "")"))
struct FromUpstreamTests {
    /// What a fixture server recorded: method, path, Authorization (nil when absent).
    static func requests(_ fixture: PythonFixture) throws -> [(method: String, path: String, authorization: String?)] {
        let r = try TestClient.get(port: fixture.port, path: "/_test/log")
        let list = try #require(try JSONSerialization.jsonObject(with: Data(r.body)) as? [[String: Any]])
        return list.map { ($0["method"] as? String ?? "", $0["path"] as? String ?? "", $0["authorization"] as? String) }
    }

    static func resource(_ auth: AuthServerFixture, servers: [String], extra: [String] = []) throws -> PythonFixture {
        try PythonFixture(script: "protected_resource.py", arguments: ["resource", "--as-api", auth.apiURL + "/whoami"]
                          + servers.flatMap { ["--authorization-server", $0] } + extra)
    }

    static func config(dir: String, listen: UInt16, upstream: String, allowed: [String]) -> String {
        """
        listen: 127.0.0.1:\(listen)
        state_dir: \(dir)/state
        sessions:
          mcp:
            grant: client_credentials
            issuer: from_upstream
            allowed_issuers: [\(allowed.map { "\"\($0)\"" }.joined(separator: ", "))]
            client_id: svc
            client_secret: svc-secret
        routes:
          - match: /
            upstream: \(upstream)
            session: mcp
        """
    }

    static func write(_ text: String, dir: String) throws -> String {
        let path = dir + "/bearerd.yaml"
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    static func json(_ r: TestClient.Response) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(r.body))) as? [String: Any] ?? [:]
    }

    /// The 401 names the metadata; its list starts with a foreign server and then the allowed
    /// one: bearerd picks the allowed one, gets a client_credentials token for `resource` = the
    /// upstream (the upstream accepts only such tokens), requests flow; the probe carried no
    /// credentials, the foreign server heard nothing. `check` explains it; with the upstream
    /// down, `bearerd token` uses the copy kept in state_dir (logged) while `check` fails.
    @Test func discoversTheAllowedServerTheUpstreamNames() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let foreign = try PythonFixture(script: "protected_resource.py", arguments: ["recorder"])
        defer { foreign.stop() }
        let foreignURL = "http://127.0.0.1:\(foreign.port)"
        let upstream = try Self.resource(auth, servers: [foreignURL, auth.issuer])
        var upstreamUp = true
        defer { if upstreamUp { upstream.stop() } }
        let upstreamURL = "http://127.0.0.1:\(upstream.port)"
        let dir = try RunningBearerd.tempDir("from-upstream")
        let port = try RunningBearerd.freePort()
        let text = Self.config(dir: dir, listen: port, upstream: upstreamURL, allowed: [auth.issuer])
        let bearerd = try RunningBearerd(config: text, dir: dir)
        defer { _ = bearerd.stop() }
        #expect(bearerd.waitServing(port: port, path: "/healthz-not-a-route") != nil, "\(bearerd.logs)")

        let r = try TestClient.get(port: port, path: "/tools/list")
        #expect(r.status == 200, "\(r.bodyText) \(bearerd.logs)")
        let body = Self.json(r)
        #expect(body["client_id"] as? String == "svc")
        #expect(body["resource"] as? [String] == [upstreamURL], "RFC 8707 resource: \(body)")

        let seen = try Self.requests(upstream)
        // The probe (GET of the base URL) and the metadata fetch: no credentials of any kind.
        #expect(seen.count >= 2 && seen[0].method == "GET" && seen[0].path == "/" && seen[0].authorization == nil, "\(seen)")
        #expect(seen.contains { $0.path == "/.well-known/oauth-protected-resource" && $0.authorization == nil }, "\(seen)")
        #expect(seen.contains { $0.path == "/tools/list" && $0.authorization?.hasPrefix("Bearer ") == true }, "\(seen)")
        #expect(try Self.requests(foreign).isEmpty, "the foreign authorization server must hear nothing")

        // Item 3: a later rejection naming other metadata is logged (once), never followed: the
        // token is refreshed and the request replayed with the same authorization server.
        let other = foreignURL + "/.well-known/oauth-protected-resource"
        let set = try TestClient(port: upstream.port)
        try set.send("POST /_test/challenge-metadata?url=\(other) HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        #expect(try set.readResponse().status == 200)
        try auth.revokeAll()
        for _ in 0..<2 {
            let again = try TestClient.get(port: port, path: "/tools/call")
            #expect(again.status == 200, "\(again.bodyText) \(bearerd.logs)")
            try auth.revokeAll()
        }
        #expect(bearerd.waitLog("names other protected resource metadata; not followed"), "\(bearerd.logs)")
        #expect(bearerd.logs.components(separatedBy: "names other protected resource metadata").count == 2, "warned once per URL: \(bearerd.logs)")
        #expect(bearerd.logs.contains(other))
        #expect(try Self.requests(foreign).isEmpty, "the foreign authorization server must hear nothing")
        // Resolving again now (check, SIGHUP) would refuse that URL (plain http, another origin):
        // the upstream goes back to its own metadata.
        let reset = try TestClient(port: upstream.port)
        try reset.send("POST /_test/challenge-metadata?url= HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        #expect(try reset.readResponse().status == 200)

        let configPath = bearerd.configPath
        let check = try CommandLineTests.run(["check", "-c", configPath])
        #expect(check.status == 0, "\(check.stdout)\(check.stderr)")
        #expect(check.stdout.contains("sessions.mcp: authorization server \(auth.issuer) (in allowed_issuers), named by the upstream \(upstreamURL) "
                                      + "in its protected resource metadata \(upstreamURL)/.well-known/oauth-protected-resource (from its 401's resource_metadata); "
                                      + "token endpoint \(auth.tokenURL); resource \(upstreamURL)"), "\(check.stdout)")
        #expect(try Self.requests(foreign).isEmpty)

        // The upstream goes away: the kept copy (checked again) serves `bearerd token`; `check`
        // does not use kept copies and says the upstream cannot be reached.
        _ = bearerd.stop()
        upstream.stop()
        upstreamUp = false
        let token = try CommandLineTests.run(["token", "mcp", "-c", bearerd.configPath])
        #expect(token.status == 0, "\(token.stdout)\(token.stderr)")
        #expect(token.stderr.contains("using its protected resource metadata kept from an earlier start"), "\(token.stderr)")
        #expect(!token.stdout.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty)
        let down = try CommandLineTests.run(["check", "-c", configPath])
        #expect(down.status != 0)
        #expect((down.stdout + down.stderr).contains("sessions.mcp.issuer: from_upstream: cannot read the protected resource metadata of the upstream \(upstreamURL)"), "\(down.stdout)\(down.stderr)")
        #expect(try Self.requests(foreign).isEmpty)
    }

    /// Metadata naming only an authorization server outside `allowed_issuers`: `check` and the
    /// start are refused with the server named (error and log line), the recording server
    /// receives nothing at all (not even discovery), no token is asked anywhere.
    @Test func refusesAServerOutsideTheAllowList() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let foreign = try PythonFixture(script: "protected_resource.py", arguments: ["recorder"])
        defer { foreign.stop() }
        let foreignURL = "http://127.0.0.1:\(foreign.port)"
        let upstream = try Self.resource(auth, servers: [foreignURL])
        defer { upstream.stop() }
        let upstreamURL = "http://127.0.0.1:\(upstream.port)"
        let dir = try RunningBearerd.tempDir("from-upstream-foreign")
        let port = try RunningBearerd.freePort()
        let text = Self.config(dir: dir, listen: port, upstream: upstreamURL, allowed: [auth.issuer])
        let configPath = try Self.write(text, dir: dir)

        let check = try CommandLineTests.run(["check", "-c", configPath])
        #expect(check.status == 1)
        let all = check.stdout + check.stderr
        #expect(all.contains("sessions.mcp.issuer: from_upstream: \(upstreamURL)/.well-known/oauth-protected-resource: "
                             + "the upstream names authorization server \(foreignURL), none of them in allowed_issuers: refused"), "\(all)")

        let bearerd = try RunningBearerd(config: text, dir: try RunningBearerd.tempDir("from-upstream-foreign-run"))
        let status = bearerd.stop(seconds: 20)
        #expect(status != nil && status != 0, "the start is refused")
        #expect(bearerd.logs.contains("from_upstream: the upstream's protected resource metadata is refused") && bearerd.logs.contains(foreignURL), "\(bearerd.logs)")
        #expect(try Self.requests(foreign).isEmpty, "the foreign authorization server must hear nothing")
        #expect(try auth.stats()["token_requests"] as? Int == 0)
    }

    /// Metadata for another resource (RFC 9728 §3.3): refused, no token asked.
    @Test func refusesMetadataForAnotherResource() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let upstream = try Self.resource(auth, servers: [auth.issuer], extra: ["--resource", "https://elsewhere.example.com/"])
        defer { upstream.stop() }
        let upstreamURL = "http://127.0.0.1:\(upstream.port)"
        let dir = try RunningBearerd.tempDir("from-upstream-resource")
        let configPath = try Self.write(Self.config(dir: dir, listen: try RunningBearerd.freePort(), upstream: upstreamURL, allowed: [auth.issuer]), dir: dir)
        let check = try CommandLineTests.run(["check", "-c", configPath])
        #expect(check.status == 1)
        #expect((check.stdout + check.stderr).contains("the protected resource metadata is for https://elsewhere.example.com/, not the upstream \(upstreamURL) (RFC 9728 §3.3)"),
                "\(check.stdout)\(check.stderr)")
        #expect(try auth.stats()["token_requests"] as? Int == 0)
    }

    /// A 401 without `resource_metadata`: the well-known URL, path-inserted for the upstream's
    /// base path (RFC 9728 §3.1), and requests flow.
    @Test func wellKnownURLWhenTheChallengeNamesNone() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let upstream = try Self.resource(auth, servers: [auth.issuer], extra: ["--no-challenge-metadata", "--base-path", "/mcp"])
        defer { upstream.stop() }
        let upstreamURL = "http://127.0.0.1:\(upstream.port)/mcp"
        let dir = try RunningBearerd.tempDir("from-upstream-wellknown")
        let port = try RunningBearerd.freePort()
        let text = Self.config(dir: dir, listen: port, upstream: upstreamURL, allowed: [auth.issuer])
        let check = try CommandLineTests.run(["check", "-c", try Self.write(text, dir: dir)])
        #expect(check.status == 0, "\(check.stdout)\(check.stderr)")
        #expect(check.stdout.contains("in its protected resource metadata http://127.0.0.1:\(upstream.port)/.well-known/oauth-protected-resource/mcp (at the well-known URL)"),
                "\(check.stdout)")
        let bearerd = try RunningBearerd(config: text, dir: try RunningBearerd.tempDir("from-upstream-wellknown-run"))
        defer { _ = bearerd.stop() }
        #expect(bearerd.waitServing(port: port) != nil, "\(bearerd.logs)")
        let r = try TestClient.get(port: port, path: "/call")
        #expect(r.status == 200, "\(r.bodyText) \(bearerd.logs)")
        #expect(Self.json(r)["resource"] as? [String] == [upstreamURL])
        #expect(Self.json(r)["path"] as? String == "/mcp/call")
        let seen = try Self.requests(upstream)
        #expect(seen.first?.path == "/mcp" && seen.first?.authorization == nil, "\(seen)")
    }
}
