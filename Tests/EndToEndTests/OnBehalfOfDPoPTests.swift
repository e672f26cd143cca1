import Foundation
import Testing
import BearerdTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// Why the peers cannot check DPoP (PyJWT, cryptography or joserfc missing from the tests' venv), or nil.
let onBehalfOfDPoPPeersMissing = PythonFixture.unavailable(modules: ["jwt", "cryptography", "joserfc"])

/// On behalf of callers (docs/architecture.md §6.16) with DPoP sessions (RFC 9449, §6.11) and
/// `audience`/`resource`: the real `bearerd` binary against `exchange_sts.py`, which verifies
/// the proof on every exchange (htm, htu, iat, jti, signature with the embedded key, a nonce it
/// can demand) and binds what it issues (`token_type: DPoP`, `cnf.jkt`), and `identity_origin.py`,
/// which accepts a bound token only as `Authorization: DPoP` with a proof (ath, htu, jti) made
/// with the key of the token's `cnf.jkt`. Both compute thumbprints with joserfc, independent of
/// bearerd; the expected one is what `bearerd check` prints for the session's key file.
@Suite("On behalf of callers with DPoP", .serialized,
       .enabled(if: Prerequisite.runs(onBehalfOfDPoPPeersMissing == nil), "\(onBehalfOfDPoPPeersMissing ?? "")"))
struct OnBehalfOfDPoPTests {
    typealias Peers = OnBehalfOfTests.Peers
    typealias Proxy = OnBehalfOfTests.Proxy
    typealias Failure = OnBehalfOfTests.Failure

    static let audience = "https://orders.internal"
    static let resource = "https://orders.internal/api"

    /// A P-256 key made with the openssl command (0600), for `dpop_key_file:`.
    static func dpopKey() throws -> String {
        let dir = try RunningBearerd.tempDir("obo-dpop-key")
        let key = dir + "/caller.dpop.pem"
        let gen = try DeployTests.run("/usr/bin/openssl", ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key])
        guard gen.status == 0 else { throw Failure(description: "openssl genpkey: \(gen.stderr)") }
        guard chmod(key, 0o600) == 0 else { throw Failure(description: "chmod \(key)") }
        return key
    }

    /// The key's thumbprint (RFC 7638) as `bearerd check` prints it for the running config.
    static func jkt(_ b: Proxy, session: String) throws -> String {
        let check = try CommandLineTests.run(["check", "-c", b.bearerd.configPath])
        guard check.status == 0 else { throw Failure(description: "bearerd check: \(check.stderr)") }
        let prefix = "sessions.\(session): DPoP key "
        guard let line = check.stdout.split(separator: "\n").first(where: { $0.hasPrefix(prefix) }),
              let range = line.range(of: ", jkt ") else {
            throw Failure(description: "no jkt for \(session) in: \(check.stdout)")
        }
        return String(line[range.upperBound...]).trimmingCharacters(in: .whitespaces)
    }

    /// The `subject: caller` token exchange session with DPoP, `audience` and `resource`.
    static func exchangeSession(_ peers: Peers, key: String) -> String {
        """
          caller:
            grant: token_exchange
            token_url: \(peers.tokenURL)
            client_id: sidecar
            client_secret: sidecar-secret
            subject: caller
            audience: \(audience)
            resource: \(resource)
            dpop: true
            dpop_key_file: \(key)
        """
    }

    static func json(_ r: TestClient.Response) -> [String: Any] { OnBehalfOfTests.json(r) }

    /// What the STS logged: the nonce demands and each /token request (outcome, proof key, binding, audience, resource).
    static func stsDPoP(_ peers: Peers) throws -> (nonceDemands: Int, log: [[String: Any]]) {
        let obj = (Peers.json(try Peers.call(peers.stsPort, "GET", "/control/stats")) as? [String: Any]) ?? [:]
        return (obj["nonce_demands"] as? Int ?? -1, obj["log"] as? [[String: Any]] ?? [])
    }

    /// What the origin counted: requests whose proof and key binding verified, its nonce demands.
    static func originDPoP(_ peers: Peers) throws -> (ok: Int, nonceDemands: Int, requests: [[String: Any]]) {
        let obj = (Peers.json(try Peers.call(peers.originPort, "GET", "/control/log")) as? [String: Any]) ?? [:]
        return (obj["dpop_ok"] as? Int ?? -1, obj["nonce_demands"] as? Int ?? -1, obj["requests"] as? [[String: Any]] ?? [])
    }

    /// Every successful exchange carried a valid proof made with bearerd's key and got a bound
    /// token; `audience` and `resource` went with every request.
    static func expectBoundExchanges(_ log: [[String: Any]], jkt: String, audience: [String], resource: [String],
                                     sourceLocation: SourceLocation = #_sourceLocation) {
        let ok = log.filter { $0["outcome"] as? String == "ok" }
        #expect(!ok.isEmpty, "no exchange succeeded: \(log)", sourceLocation: sourceLocation)
        for e in ok {
            #expect(e["dpop_jkt"] as? String == jkt && e["token_type"] as? String == "DPoP",
                    "an exchange without a valid proof of bearerd's key: \(e)", sourceLocation: sourceLocation)
        }
        for e in log {
            #expect(e["audience"] as? [String] == audience && e["resource"] as? [String] == resource,
                    "audience/resource: \(e)", sourceLocation: sourceLocation)
        }
    }

    // MARK: - Tests

    /// `subject: caller` with `dpop: true`, `audience` and `resource`, the STS demanding a nonce:
    /// the first exchange is demanded a nonce once and answered (one retry), then two callers
    /// interleaved (60 requests, 4 connections): every exchange carried a proof of bearerd's key
    /// (one jkt) and `audience`/`resource`, each caller has its own bound token (one exchange
    /// each), and every upstream request carried `Authorization: DPoP` with a proof the origin
    /// verified against the token's `cnf.jkt`; no caller token reaches the upstream.
    @Test func tokenExchangeWithDPoPAudienceAndResource() throws {
        let peers = try Peers()
        defer { peers.stop() }
        try peers.stsControl("dpop_nonce?on=1")
        let key = try Self.dpopKey()
        let b = try Proxy(sessions: Self.exchangeSession(peers, key: key), routes: OnBehalfOfTests.apiRoute(peers))
        defer { b.stop() }
        let jkt = try Self.jkt(b, session: "caller")
        let alice = try peers.mint("alice"), bob = try peers.mint("bob")

        let first = try b.get("/api/first", bearer: alice)
        #expect(first.status == 200, "\(first.status) \(first.bodyText) \(b.bearerd.logs.suffix(2000))")
        #expect(Self.json(first)["sub"] as? String == "alice" && Self.json(first)["scheme"] as? String == "DPoP"
                && Self.json(first)["jkt"] as? String == jkt, "\(first.bodyText)")
        var sts = try Self.stsDPoP(peers)
        #expect(sts.nonceDemands == 1, "\(sts.log)")
        #expect(sts.log.map { $0["outcome"] as? String ?? "" } == ["use_dpop_nonce", "ok"], "\(sts.log)")
        // The demanded request carried a proof (without the nonce): its only fault.
        #expect((sts.log.first?["dpop_error"] as? String)?.contains("nonce") == true, "\(sts.log)")

        var jobs: [(path: String, sub: String, token: String)] = (0..<60).map { i in
            i % 2 == 0 ? ("/api/req/\(i)", "alice", alice) : ("/api/req/\(i)", "bob", bob)
        }
        jobs.shuffle()
        let results = OnBehalfOfTests.run(jobs, port: b.port, workers: 4)
        #expect(results.count == 60)
        #expect(results.wrong.isEmpty, "\(results.wrong.count) wrong: \(results.wrong.prefix(5)) \(b.bearerd.logs.suffix(2000))")
        #expect(results.jtis["alice"]?.count == 1 && results.jtis["bob"]?.count == 1, "\(results.jtis)")
        #expect(results.jtis["alice"]?.isDisjoint(with: results.jtis["bob"] ?? []) == true)

        sts = try Self.stsDPoP(peers)
        #expect(try peers.stsStats().exchanges == ["alice": 1, "bob": 1], "\(sts.log)")
        #expect(sts.nonceDemands == 1, "the nonce was not kept for the next exchange: \(sts.log)")
        #expect(sts.log.count == 3, "\(sts.log)")
        Self.expectBoundExchanges(sts.log, jkt: jkt, audience: [Self.audience], resource: [Self.resource])

        let origin = try Self.originDPoP(peers)
        #expect(origin.requests.count == 61, "\(origin.requests.count)")
        #expect(origin.requests.allSatisfy { $0["status"] as? Int == 200 && $0["scheme"] as? String == "DPoP" && $0["jkt"] as? String == jkt },
                "\(origin.requests.filter { $0["status"] as? Int != 200 }.prefix(3))")
        #expect(origin.ok == 61)
        let log = try peers.originLog()
        #expect(log.callerTokensSeen == 0, "a caller's own token reached the origin")
        #expect(!log.allHeaderText.contains(OnBehalfOfTests.signature(alice)) && !log.allHeaderText.contains(OnBehalfOfTests.signature(bob)))
        #expect(!b.bearerd.logs.contains(OnBehalfOfTests.signature(alice)), "a caller token was logged")

        let m = try b.metrics()
        #expect(OnBehalfOfTests.sum(m, "bearerd_dpop_nonce_retries_total", ["session": "caller", "side": "token_endpoint"]) == 1)
        #expect(OnBehalfOfTests.sum(m, "bearerd_caller_exchanges_total", ["session": "caller", "outcome": "ok"]) == 2)
    }

    /// The origin demands a nonce (first contact, then a new one): each demand is answered with
    /// one resend carrying the nonce and the same exchanged token, never a new exchange. Then
    /// the origin revokes the caller's token: bearerd exchanges again (with a proof) and replays
    /// once, the new token bound to the same key.
    @Test func upstreamNonceDemandsAndRevocationKeepTheBinding() throws {
        let peers = try Peers()
        defer { peers.stop() }
        _ = try Peers.call(peers.originPort, "POST", "/control/dpop_nonce?on=1")
        let key = try Self.dpopKey()
        let b = try Proxy(sessions: Self.exchangeSession(peers, key: key), routes: OnBehalfOfTests.apiRoute(peers))
        defer { b.stop() }
        let jkt = try Self.jkt(b, session: "caller")
        let carol = try peers.mint("carol")

        let first = try b.get("/api/n1", bearer: carol)
        #expect(first.status == 200 && Self.json(first)["sub"] as? String == "carol" && Self.json(first)["jkt"] as? String == jkt,
                "\(first.status) \(first.bodyText) \(b.bearerd.logs.suffix(2000))")
        let jti1 = Self.json(first)["jti"] as? String
        _ = try Peers.call(peers.originPort, "POST", "/control/dpop_nonce?on=1")
        let second = try b.get("/api/n2", bearer: carol)
        #expect(second.status == 200 && Self.json(second)["jti"] as? String == jti1, "\(second.status) \(second.bodyText)")
        var origin = try Self.originDPoP(peers)
        #expect(origin.nonceDemands == 2, "\(origin.requests)")
        #expect(origin.requests.map { $0["status"] as? Int ?? 0 } == [401, 200, 401, 200], "\(origin.requests)")
        #expect(try peers.stsStats().exchanges == ["carol": 1], "a nonce demand was taken for a revocation")

        try peers.revokeAtOrigin(sub: "carol")
        let third = try b.get("/api/r", bearer: carol)
        #expect(third.status == 200 && Self.json(third)["sub"] as? String == "carol" && Self.json(third)["jkt"] as? String == jkt,
                "\(third.status) \(third.bodyText)")
        let jti2 = Self.json(third)["jti"] as? String
        #expect(jti2 != nil && jti2 != jti1)
        #expect(try peers.stsStats().exchanges == ["carol": 2])
        let sts = try Self.stsDPoP(peers)
        #expect(sts.log.count == 2, "\(sts.log)")
        Self.expectBoundExchanges(sts.log, jkt: jkt, audience: [Self.audience], resource: [Self.resource])
        origin = try Self.originDPoP(peers)
        #expect(origin.ok == 3, "\(origin.requests)")
        let m = try b.metrics()
        #expect(OnBehalfOfTests.sum(m, "bearerd_dpop_nonce_retries_total", ["session": "caller", "side": "upstream"]) == 2)
    }

    /// Entra-style on-behalf-of (`grant: jwt_bearer`, `assertion: caller`,
    /// `requested_token_use=on_behalf_of`) with DPoP, `audience` and `resource`, the STS demanding
    /// a nonce: each caller one exchange with a proof of bearerd's key, the upstream sees each
    /// caller's identity through a verified proof, never the caller's token.
    @Test func jwtBearerOnBehalfOfWithDPoP() throws {
        let peers = try Peers()
        defer { peers.stop() }
        try peers.stsControl("dpop_nonce?on=1")
        let key = try Self.dpopKey()
        let b = try Proxy(sessions: """
              obo:
                grant: jwt_bearer
                token_url: \(peers.tokenURL)
                client_id: sidecar
                client_secret: sidecar-secret
                client_auth: client_secret_post
                assertion: caller
                scope: orders.read
                audience: \(Self.audience)
                resource: \(Self.resource)
                params: { requested_token_use: on_behalf_of }
                dpop: true
                dpop_key_file: \(key)
            """, routes: OnBehalfOfTests.apiRoute(peers, session: "obo"))
        defer { b.stop() }
        let jkt = try Self.jkt(b, session: "obo")
        let harry = try peers.mint("harry"), ivy = try peers.mint("ivy")
        for (sub, token) in [("harry", harry), ("ivy", ivy), ("harry", harry)] {
            let r = try b.get("/api/obo", bearer: token)
            #expect(r.status == 200 && Self.json(r)["sub"] as? String == sub && Self.json(r)["jkt"] as? String == jkt,
                    "\(r.status) \(r.bodyText) \(b.bearerd.logs.suffix(1500))")
        }
        #expect(try peers.stsStats().exchanges == ["harry": 1, "ivy": 1])
        let sts = try Self.stsDPoP(peers)
        #expect(sts.nonceDemands == 1 && sts.log.count == 3, "\(sts.log)")
        // (The nonce demand comes before client authentication: only answered requests name the client's method.)
        #expect(sts.log.allSatisfy { $0["grant"] as? String == "urn:ietf:params:oauth:grant-type:jwt-bearer"
                                      && $0["requested_token_use"] as? String == "on_behalf_of"
                                      && ($0["outcome"] as? String != "ok" || $0["auth"] as? String == "client_secret_post") },
                "\(sts.log)")
        Self.expectBoundExchanges(sts.log, jkt: jkt, audience: [Self.audience], resource: [Self.resource])
        let origin = try Self.originDPoP(peers)
        #expect(origin.ok == 3 && origin.requests.count == 3, "\(origin.requests)")
        let log = try peers.originLog()
        #expect(log.callerTokensSeen == 0 && !log.allHeaderText.contains(OnBehalfOfTests.signature(harry)))
    }
}
