// The shared token cache's Redis client (docs/architecture.md §6.13) against a real redis-server:
// AUTH and SELECT, unix sockets, timeouts, a server that goes away and comes back.

import Foundation
import Testing
import BearerdTestSupport
import BearerdProxyCore
import BearerdConfig
import BearerdIO
import BearerdTLS
import BearerdOAuth
@testable import BearerdSessions

@Suite(.serialized) struct RedisConnectionTests {
    let loop = EventLoop(index: 960, readBufferSize: 4096)

    /// Sends one command on the loop and waits (bounded) for its answer.
    func send(_ c: RedisConnection, _ args: [String], timeout: Duration? = nil) async -> Result<RESPValue, RedisFailure> {
        await withCheckedContinuation { k in
            loop.execute { c.send(args, timeout: timeout) { k.resume(returning: $0) } }
        }
    }

    @Test(.enabled(if: Prerequisite.runs(RedisServer.isAvailable))) func authSelectAndCommandsOverTCP() async throws {
        let redis = try RedisServer(password: "s3cret")
        var options = RedisOptions(endpoint: .tcp(host: "127.0.0.1", port: redis.port, tls: false), database: 3, password: OAuthSecret("s3cret"))
        options.commandTimeout = .seconds(2)
        let c = RedisConnection(options: options, loop: loop)
        #expect(try await send(c, ["SET", "k", "v"]).get() == .simple("OK"))
        #expect(try await send(c, ["GET", "k"]).get() == .bulk(Array("v".utf8)))
        // SELECT 3 took effect: database 0 does not have it.
        #expect(try redis.cli(["-n", "3", "GET", "k"]) == "v")
        #expect(try redis.cli(["-n", "0", "GET", "k"]) == "")
        // An error reply is an answer, not a failure.
        guard case .success(.error) = await send(c, ["INCR", "k"]) else { Issue.record("expected an error reply"); return }
        loop.execute { c.shutdown() }
    }

    @Test(.enabled(if: Prerequisite.runs(RedisServer.isAvailable))) func wrongPasswordFailsWithoutShowingIt() async throws {
        let redis = try RedisServer(password: "right")
        let options = RedisOptions(endpoint: .tcp(host: "127.0.0.1", port: redis.port, tls: false), database: 0, password: OAuthSecret("wrong-pw"))
        let c = RedisConnection(options: options, loop: loop)
        guard case .failure(let f) = await send(c, ["GET", "k"]) else { Issue.record("AUTH should fail"); return }
        #expect(f.kind == "auth")
        #expect(!f.description.contains("wrong-pw"))
        loop.execute { c.shutdown() }
    }

    @Test(.enabled(if: Prerequisite.runs(RedisServer.isAvailable))) func unixSocket() async throws {
        let redis = try RedisServer()
        var options = RedisOptions(endpoint: .unix(path: redis.socketPath), database: 0)
        options.commandTimeout = .seconds(2)
        let c = RedisConnection(options: options, loop: loop)
        #expect(try await send(c, ["PING"]).get() == .simple("PONG"))
        loop.execute { c.shutdown() }
    }

    @Test(.enabled(if: Prerequisite.runs(RedisServer.isAvailable))) func slowAnswerTimesOutAndTheConnectionRecovers() async throws {
        let redis = try RedisServer()
        let options = RedisOptions(endpoint: .tcp(host: "127.0.0.1", port: redis.port, tls: false), database: 0)
        let c = RedisConnection(options: options, loop: loop)
        #expect(try await send(c, ["PING"], timeout: .seconds(2)).get() == .simple("PONG"))
        // DEBUG SLEEP holds the server for 3 s, far past the 50 ms default: the answer is a
        // timeout long before the server's own (bounds generous for a loaded machine).
        let started = ContinuousClock.now
        guard case .failure(let f) = await send(c, ["DEBUG", "SLEEP", "3"]) else { Issue.record("expected a timeout"); return }
        #expect(f.kind == "timeout")
        #expect(ContinuousClock.now - started < .milliseconds(2500))
        // While the server still sleeps: a failure (at once during the backoff, else a timeout), never a wait for it.
        guard case .failure(let b) = await send(c, ["PING"]) else { Issue.record("expected a failure"); return }
        #expect(b.kind == "backoff" || b.kind == "timeout" || b.kind == "connect")
        // After it, a new connection answers.
        var answered = false
        for _ in 0..<100 where !answered {
            if case .success(.simple("PONG")) = await send(c, ["PING"], timeout: .seconds(1)) { answered = true } else {
                try await Task.sleep(for: .milliseconds(50))
            }
        }
        #expect(answered)
        loop.execute { c.shutdown() }
    }

    @Test(.enabled(if: Prerequisite.runs(RedisServer.isAvailable))) func serverGoneThenBack() async throws {
        let redis = try RedisServer()
        let options = RedisOptions(endpoint: .tcp(host: "127.0.0.1", port: redis.port, tls: false), database: 0)
        let c = RedisConnection(options: options, loop: loop)
        #expect(try await send(c, ["PING"], timeout: .seconds(2)).get() == .simple("PONG"))
        redis.stop()
        guard case .failure = await send(c, ["PING"]) else { Issue.record("expected a failure"); return }
        try redis.start()
        var answered = false
        for _ in 0..<200 where !answered {
            if case .success(.simple("PONG")) = await send(c, ["PING"], timeout: .seconds(1)) { answered = true } else {
                try await Task.sleep(for: .milliseconds(50))
            }
        }
        #expect(answered, "reconnects after the backoff once the server is back")
        loop.execute { c.shutdown() }
    }

    @Test(.enabled(if: Prerequisite.runs(RedisServer.isAvailable))) func redissVerifiesTheServerAndSendsAClientCertificate() async throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let redis = try RedisServer(tls: (pki.serverCertFile, pki.serverKeyFile, pki.caFile, true))
        let tlsPort = try #require(redis.tlsPort)
        // mTLS: the CA verifies the server (host 127.0.0.1 in its SANs), the client certificate is sent.
        var options = RedisOptions(endpoint: .tcp(host: "127.0.0.1", port: tlsPort, tls: true), database: 0,
                                   tlsContext: try TLSContext.client(caFile: pki.caFile, clientCert: pki.clientCertFile,
                                                                     clientKey: pki.clientKeyFile, alpn: []))
        options.commandTimeout = .seconds(2)
        let c = RedisConnection(options: options, loop: loop)
        #expect(try await send(c, ["PING"]).get() == .simple("PONG"))
        loop.execute { c.shutdown() }
        // Without the CA (system trust store only) the server is not trusted.
        var untrusted = options
        untrusted.tlsContext = try TLSContext.client(caFile: nil, clientCert: pki.clientCertFile, clientKey: pki.clientKeyFile, alpn: [])
        let u = RedisConnection(options: untrusted, loop: loop)
        guard case .failure = await send(u, ["PING"]) else { Issue.record("an unverified server must fail"); return }
        loop.execute { u.shutdown() }
    }
}
