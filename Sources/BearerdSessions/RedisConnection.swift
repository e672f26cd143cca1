import BearerdIO
import BearerdOAuth
import BearerdProxyCore
import BearerdTLS
import BearerdConfig
#if canImport(Glibc)
import Glibc
#endif

/// Why a Redis command got no usable answer (the caller falls back to its local session).
struct RedisFailure: Error, CustomStringConvertible {
    /// A short, bounded label: `connect`, `timeout`, `closed`, `protocol`, `auth`, `backoff`, `server_error`.
    var kind: String
    /// What happened, never a password.
    var detail: String
    var description: String { "\(kind): \(detail)" }
}

/// How to reach the shared cache's Redis (resolved once: the password read, the TLS context built).
struct RedisOptions {
    var endpoint: SharedCacheConfig.Endpoint
    var database: Int
    var username: String?
    /// Never logged (`OAuthSecret` prints `<redacted>`).
    var password: OAuthSecret?
    var tlsContext: TLSContext?
    /// Bound on connecting (and the TLS handshake and AUTH/SELECT).
    var connectTimeout: Duration = .milliseconds(500)
    /// Default bound on one command's answer (docs/architecture.md §6.13: reads answer fast or not at all).
    var commandTimeout: Duration = .milliseconds(50)
}

/// One Redis connection on an event loop (the session's queue), a small RESP2 client: commands
/// are pipelined, answers matched in order, each command bounded by its own timeout. Nothing
/// blocks: DNS goes through `Resolver`, the socket is a non-blocking `SocketChannel`.
///
/// Owns, on `loop` only: the channel, the reply parser, the queue of commands awaiting an answer
/// (the handshake's AUTH and SELECT first), and the reconnect backoff. Invariants: every
/// command's completion runs exactly once, on `loop`; a timeout, a malformed reply or a closed
/// connection fails every pending command and closes the connection (later answers could no
/// longer be matched); while backing off after a failure, commands fail at once (`backoff`) so
/// callers fall back without waiting; the backoff grows 100 ms → 5 s and resets on a
/// successful handshake.
final class RedisConnection: ChannelDelegate {
    typealias Completion = (Result<RESPValue, RedisFailure>) -> Void

    private enum Phase {
        /// No connection; the next command connects (if not backing off).
        case disconnected
        /// Resolving or connecting; commands are queued and sent once connected.
        case connecting
        /// Connected; AUTH/SELECT sent with the first commands.
        case connected
        /// `shutdown()`: every command fails at once, nothing reconnects.
        case shutDown
    }

    private struct Pending {
        var id: UInt64
        var bytes: [UInt8]
        var completion: Completion?
        /// Handshake commands: their answers are checked here, not handed to a caller.
        var isHandshake: Bool
    }

    let loop: EventLoop
    private let options: RedisOptions
    private var phase: Phase = .disconnected
    private var channel: SocketChannel?
    private var parser = RESPParser()
    /// Written, awaiting answers, in order.
    private var inFlight: [Pending] = []
    /// Queued while connecting.
    private var queued: [Pending] = []
    private var nextID: UInt64 = 0
    /// Distinguishes connection attempts (a late callback of an old one is ignored).
    private var connectionSerial: UInt64 = 0
    private var backoffUntil: UInt64 = 0
    private var backoffStep = 0
    /// A subscriber connection's published messages (RESP2 `message` arrays arrive unasked).
    var onPush: ((RESPValue) -> Void)?
    /// Called when the connection fails (its subscriptions, if any, are gone).
    var onFailure: (() -> Void)?
    /// Most commands pending at once (queued and in flight); more fail at once (`overload`).
    static let maxPending = 256

    init(options: RedisOptions, loop: EventLoop) {
        self.options = options
        self.loop = loop
    }

    /// Sends `arguments`; `completion` runs once on `loop` with the reply (a `-ERR` reply is a
    /// `.success(.error)`: the caller decides) or a failure. Call on `loop`.
    func send(_ arguments: [[UInt8]], timeout: Duration? = nil, completion: @escaping Completion) {
        if case .shutDown = phase {
            completion(.failure(RedisFailure(kind: "closed", detail: "the shared cache is shut down")))
            return
        }
        guard inFlight.count + queued.count < Self.maxPending else {
            completion(.failure(RedisFailure(kind: "overload", detail: "\(Self.maxPending) commands already wait for \(options.endpoint)")))
            return
        }
        if case .disconnected = phase {
            let now = monotonicNanos()
            if now < backoffUntil {
                completion(.failure(RedisFailure(kind: "backoff", detail: "reconnecting to \(options.endpoint) later")))
                return
            }
            connect()
        }
        nextID &+= 1
        let p = Pending(id: nextID, bytes: RESP.command(arguments), completion: completion, isHandshake: false)
        let serial = connectionSerial
        let id = p.id
        var limit = timeout ?? options.commandTimeout
        if case .connecting = phase { limit += options.connectTimeout }
        switch phase {
        case .connected:
            inFlight.append(p)
            channel?.write(p.bytes)
        case .connecting, .disconnected, .shutDown:
            queued.append(p)
        }
        loop.schedule(after: limit) { [weak self] in
            guard let self, self.connectionSerial == serial else { return }
            if self.inFlight.contains(where: { $0.id == id }) || self.queued.contains(where: { $0.id == id }) {
                self.fail(RedisFailure(kind: "timeout", detail: "no answer from \(self.options.endpoint) within \(limit)"))
            }
        }
    }

    /// `send` of UTF-8 strings.
    func send(_ arguments: [String], timeout: Duration? = nil, completion: @escaping Completion) {
        send(arguments.map { Array($0.utf8) }, timeout: timeout, completion: completion)
    }

    /// Closes the connection for good; pending commands fail. Call on `loop`.
    func shutdown() {
        fail(RedisFailure(kind: "closed", detail: "the shared cache is shut down"), backoff: false)
        phase = .shutDown
    }

    // MARK: Connecting

    private func connect() {
        phase = .connecting
        connectionSerial &+= 1
        let serial = connectionSerial
        parser = RESPParser()
        // The handshake goes first: AUTH (ACL user or the default user), then SELECT.
        var handshake: [[String]] = []
        if let password = options.password?.exposedValue {
            handshake.append(options.username.map { ["AUTH", $0, password] } ?? ["AUTH", password])
        }
        if options.database != 0 { handshake.append(["SELECT", String(options.database)]) }
        for command in handshake {
            nextID &+= 1
            queued.append(Pending(id: nextID, bytes: RESP.command(command), completion: nil, isHandshake: true))
        }
        let timeout = options.connectTimeout
        loop.schedule(after: timeout) { [weak self] in
            guard let self, self.connectionSerial == serial, case .connecting = self.phase else { return }
            self.fail(RedisFailure(kind: "connect", detail: "cannot connect to \(self.options.endpoint) within \(timeout)"))
        }
        switch options.endpoint {
        case .unix(let path):
            guard let address = SocketAddress.unix(path) else {
                fail(RedisFailure(kind: "connect", detail: "invalid unix socket path"))
                return
            }
            open(address, serverName: nil, port: nil, serial: serial)
        case .tcp(let host, let port, _):
            Resolver.shared.resolve(host: host, port: port, on: loop) { [weak self] result in
                guard let self, self.connectionSerial == serial, case .connecting = self.phase else { return }
                switch result {
                case .success(let addresses):
                    guard let first = addresses.first else {
                        self.fail(RedisFailure(kind: "connect", detail: "cannot resolve \(host)"))
                        return
                    }
                    self.open(first, serverName: host, port: port, serial: serial)
                case .failure(let error):
                    self.fail(RedisFailure(kind: "connect", detail: "cannot resolve \(host): \(error)"))
                }
            }
        }
    }

    private func open(_ address: SocketAddress, serverName: String?, port: UInt16?, serial: UInt64) {
        do {
            var engine: TLSEngine?
            if let context = options.tlsContext, let serverName {
                engine = try TLSEngine(client: context, serverName: serverName, port: port)
            }
            channel = try SocketChannel.connect(to: address, loop: loop, tls: engine, delegate: self)
        } catch {
            fail(RedisFailure(kind: "connect", detail: "\(options.endpoint): \(error)"))
        }
    }

    /// Fails every pending and queued command, closes the connection and (unless shutting
    /// down) starts a backoff before the next attempt.
    private func fail(_ failure: RedisFailure, backoff: Bool = true) {
        let pending = inFlight + queued
        inFlight = []
        queued = []
        connectionSerial &+= 1
        if case .shutDown = phase {} else { phase = .disconnected }
        let ch = channel
        channel = nil
        ch?.delegate = nil
        ch?.close()
        if backoff {
            let steps: [UInt64] = [100, 200, 400, 800, 1_600, 3_200, 5_000]
            let ms = steps[min(backoffStep, steps.count - 1)]
            backoffStep = min(backoffStep + 1, steps.count)
            backoffUntil = monotonicNanos() &+ ms * 1_000_000
        }
        for p in pending { p.completion?(.failure(failure)) }
        onFailure?()
    }

    // MARK: ChannelDelegate

    func channelActive(_ channel: SocketChannel) {
        guard channel === self.channel, case .connecting = phase else { return }
        phase = .connected
        var bytes: [UInt8] = []
        for p in queued { bytes.append(contentsOf: p.bytes) }
        inFlight = queued
        queued = []
        if !bytes.isEmpty { channel.write(bytes) }
    }

    func channelRead(_ channel: SocketChannel, _ bytes: UnsafeRawBufferPointer) {
        guard channel === self.channel else { return }
        parser.feed(bytes)
        while channel === self.channel {
            let value: RESPValue
            do throws(RESPError) {
                guard let v = try parser.next() else { return }
                value = v
            } catch {
                fail(RedisFailure(kind: "protocol", detail: "malformed reply from \(options.endpoint): \(error.reason)"))
                return
            }
            if let onPush, case .array(let items?) = value, let kind = items.first?.bytes,
               kind == Array("message".utf8) || kind == Array("pmessage".utf8) {
                onPush(value)
                continue
            }
            guard !inFlight.isEmpty else {
                fail(RedisFailure(kind: "protocol", detail: "an unrequested reply from \(options.endpoint)"))
                return
            }
            let p = inFlight.removeFirst()
            if p.isHandshake {
                if case .error(let message) = value {
                    // The server's message, never the password we sent.
                    let first = message.split(separator: " ").first.map(String.init) ?? "ERR"
                    fail(RedisFailure(kind: "auth", detail: "\(options.endpoint) refused AUTH/SELECT (\(first))"))
                    return
                }
                backoffStep = 0
                continue
            }
            if inFlight.allSatisfy({ !$0.isHandshake }) { backoffStep = 0 }
            p.completion?(.success(value))
        }
    }

    func channelEOF(_ channel: SocketChannel) {
        guard channel === self.channel else { return }
        fail(RedisFailure(kind: "closed", detail: "\(options.endpoint) closed the connection"))
    }

    func channelError(_ channel: SocketChannel, _ error: ChannelError) {
        guard channel === self.channel else { return }
        fail(RedisFailure(kind: "connect", detail: "\(options.endpoint): \(error)"))
    }

    func channelClosed(_ channel: SocketChannel) {
        guard channel === self.channel else { return }
        fail(RedisFailure(kind: "closed", detail: "\(options.endpoint) closed the connection"))
    }
}
