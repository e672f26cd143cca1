/// The upstream connection pool's decisions, without sockets (docs/architecture.md §2: the shell only executes).
/// The shell (`BackendPool` in BearerdProxy) keeps one `StateMachine` per upstream key and maps
/// its `ConnectionID`s to connection objects and its `RequestID`s to waiting requests.
public enum BackendPool {}

extension BackendPool {
    /// A connection of one upstream key, open or being opened. Reused once the connection is gone.
    public struct ConnectionID: Hashable, Sendable, CustomStringConvertible {
        public let raw: Int
        public init(_ raw: Int) { self.raw = raw }
        public var description: String { "c\(raw)" }
    }

    /// A request waiting for a connection; chosen by the shell (unique among the waiting ones).
    public struct RequestID: Hashable, Sendable, CustomStringConvertible {
        public let raw: Int
        public init(_ raw: Int) { self.raw = raw }
        public var description: String { "r\(raw)" }
    }

    public struct Configuration: Sendable, Equatable {
        /// Idle HTTP/1.1 connections kept at most (more are closed when released).
        public var maxIdle: Int
        /// How long an idle HTTP/1.1 connection is kept, in nanoseconds.
        public var idleTimeout: UInt64
        /// A new connection may turn out to speak HTTP/2 (ALPN on https with `http2: auto` or
        /// `prior_knowledge`, or h2c prior knowledge): concurrent requests wait for it.
        public var mayUseHTTP2: Bool
        /// Remember an HTTP/1.1 answer (`http2: auto`): requests then stop waiting for a shared attempt.
        public var remembersHTTP1: Bool
        /// No connection of this key can speak HTTP/1.1 (h2c prior knowledge): a request that needs
        /// HTTP/1.1 (a WebSocket upgrade) fails at once.
        public var http1Impossible: Bool

        public init(maxIdle: Int, idleTimeout: UInt64, mayUseHTTP2: Bool, remembersHTTP1: Bool, http1Impossible: Bool) {
            self.maxIdle = maxIdle
            self.idleTimeout = idleTimeout
            self.mayUseHTTP2 = mayUseHTTP2
            self.remembersHTTP1 = remembersHTTP1
            self.http1Impossible = http1Impossible
        }
    }

    /// What a connection turned out to speak once connected (ALPN, or prior knowledge).
    public enum Negotiated: Sendable, Equatable {
        case http1
        /// The server's SETTINGS_MAX_CONCURRENT_STREAMS as known now (RFC 9113 §6.5.2).
        case http2(maxConcurrentStreams: Int)
    }

    /// What the shell knows about this key's protocol.
    public enum ProtocolKnowledge: Sendable, Equatable {
        case unknown
        /// An `auto` connection answered HTTP/1.1: no more waiting for a shared attempt.
        case http1
    }

    /// Served at once, without waiting (`StateMachine.takeReady`).
    public enum Ready: Sendable, Equatable {
        /// A new stream on an HTTP/2 connection with room (reused: it existed before).
        case stream(ConnectionID)
        /// An idle HTTP/1.1 connection, idle since `idleSince` (the shell checks it for stray
        /// input and reports `connectionClosed` if it must be dropped).
        case idleConnection(ConnectionID, idleSince: UInt64)
    }

    public enum Failure: Sendable, Equatable {
        /// The connection the request waited for could not be opened (the shell's error).
        case connectFailed
        /// The request needs HTTP/1.1 and the key speaks only HTTP/2.
        case http1Impossible
    }

    public enum Action: Sendable, Equatable {
        /// Resolve and connect a new connection (HTTP/1.1 only: a WebSocket upgrade); report
        /// `resolved`, then `connected` or `connectFailed`.
        case connect(ConnectionID, http1Only: Bool)
        /// Hand a new (`reused: false`) or idle HTTP/1.1 connection to the request.
        case lease(ConnectionID, to: RequestID, reused: Bool, idleSince: UInt64 = 0)
        /// Open a new stream on the HTTP/2 connection for the request.
        case openStream(ConnectionID, for: RequestID, reused: Bool)
        case fail(RequestID, Failure)
        /// A new HTTP/1.1 connection whose request went away idles in the pool.
        case park(ConnectionID)
        case close(ConnectionID)
    }

    /// A released HTTP/1.1 connection's fate: idle until `deadline` (the idle timeout), or closed.
    public enum Release: Sendable, Equatable { case park(deadline: UInt64), close }
}

extension BackendPool {
    /// The connections and waiting requests of one upstream key. Pure: the shell reports events
    /// (with the time as an argument) and executes the returned actions in order.
    ///
    /// Invariants: every waiting request is resumed exactly once (`lease`, `openStream` or
    /// `fail`) unless cancelled first, and never after `cancel`; an HTTP/1.1 connection is leased
    /// to one request at a time; idle connections ≤ `maxIdle`; streams on an HTTP/2 connection ≤
    /// its server's limit; a connection is opened only for a request that waits (RFC 9113 §10.5:
    /// a request that went away does not make another connection: its attempt serves the next).
    public struct StateMachine: Sendable {
        enum Attempt: Sendable, Equatable {
            /// May speak HTTP/2: every request that arrives meanwhile waits for it, in order.
            case shared([RequestID])
            /// HTTP/1.1, for one request (nil: it went away; the next request takes it over).
            case single(RequestID?, http1Only: Bool)
        }

        enum Phase: Sendable, Equatable {
            case unused
            case connecting(Attempt)
            case idle(since: UInt64)
            case leased
            case multiplexing(open: Int, limit: Int)
            /// GOAWAY received or sent: no new streams.
            case goingAway(open: Int)
        }

        /// Changed by the shell on a reload (same key, other limits); applies from the next event.
        public var configuration: Configuration
        public private(set) var knowledge: ProtocolKnowledge = .unknown
        /// Indexed by `ConnectionID.raw`.
        private(set) var connections: [Phase] = []
        private var freeIDs: [Int] = []
        /// Idle HTTP/1.1 connections, most recently used last (LIFO: the warmest is reused first).
        private(set) var idle: [ConnectionID] = []
        /// HTTP/2 connections taking streams, oldest first.
        private(set) var http2: [ConnectionID] = []
        /// The attempt that may speak HTTP/2, while one is in flight.
        private(set) var shared: ConnectionID?
        /// HTTP/1.1 attempts in flight, oldest first.
        private(set) var singles: [ConnectionID] = []
        /// Every waiting request: the attempt it waits for and whether it needs HTTP/1.1.
        private(set) var waiting: [RequestID: (attempt: ConnectionID, http1Only: Bool)] = [:]

        public init(configuration: Configuration) {
            self.configuration = configuration
        }

        // MARK: requests

        /// A stream on an HTTP/2 connection with room, or an idle HTTP/1.1 connection; nil when
        /// the request must wait (`request`). No allocation: the per-request path.
        public mutating func takeReady(http1Only: Bool) -> Ready? {
            if !http1Only {
                for id in http2 {
                    if case .multiplexing(let open, let limit) = connections[id.raw], open < limit {
                        connections[id.raw] = .multiplexing(open: open &+ 1, limit: limit)
                        return .stream(id)
                    }
                }
                if shared != nil { return nil }
            }
            while let id = idle.popLast() {
                guard case .idle(let since) = connections[id.raw] else { continue }
                connections[id.raw] = .leased
                return .idleConnection(id, idleSince: since)
            }
            return nil
        }

        /// A request that `takeReady` could not serve (or that needs a new connection: `fresh`)
        /// waits for an attempt in flight, or for a new one.
        public mutating func request(_ request: RequestID, http1Only: Bool, fresh: Bool = false) -> [Action] {
            var actions: [Action] = []
            serve(request, http1Only: http1Only, fresh: fresh, into: &actions)
            return actions
        }

        /// The request went away: it is never resumed. Its attempt goes on (and serves the next
        /// request, or idles), except that one still resolving is not opened (`resolved`).
        public mutating func cancel(_ request: RequestID) {
            guard let w = waiting.removeValue(forKey: request) else { return }
            switch connections[w.attempt.raw] {
            case .connecting(.shared(var list)):
                list.removeAll { $0 == request }
                connections[w.attempt.raw] = .connecting(.shared(list))
            case .connecting(.single(let r, let h1)) where r == request:
                connections[w.attempt.raw] = .connecting(.single(nil, http1Only: h1))
            default:
                break
            }
        }

        // MARK: connection attempts

        /// The attempt's address is known: false when no request waits for it any more (nothing
        /// is opened; the attempt is forgotten and a later request opens its own).
        public mutating func resolved(_ id: ConnectionID) -> Bool {
            guard case .connecting(let attempt) = phase(id) else { return false }
            guard attempt.requests.isEmpty else { return true }
            forget(id)
            return false
        }

        /// The attempt failed: every request waiting for it fails.
        public mutating func connectFailed(_ id: ConnectionID) -> [Action] {
            guard case .connecting(let attempt) = phase(id) else { return [] }
            let failed = attempt.requests.filter { waiting[$0] != nil }
            forget(id)
            return failed.map { .fail($0, .connectFailed) }
        }

        /// The attempt connected and speaks `negotiated`.
        public mutating func connected(_ id: ConnectionID, _ negotiated: Negotiated, now: UInt64) -> [Action] {
            guard case .connecting(let attempt) = phase(id) else { return [.close(id)] }
            removeAttempt(id)
            let requests = attempt.requests.filter { waiting.removeValue(forKey: $0) != nil }
            var actions: [Action] = []
            let isShared: Bool
            let singleHTTP1Only: Bool
            switch attempt {
            case .shared: isShared = true; singleHTTP1Only = false
            case .single(_, let h1): isShared = false; singleHTTP1Only = h1
            }
            switch negotiated {
            case .http1:
                if isShared && configuration.remembersHTTP1 { knowledge = .http1 }
                guard let first = requests.first else {
                    park(id, now: now, into: &actions)
                    return actions
                }
                connections[id.raw] = .leased
                actions.append(.lease(id, to: first, reused: false))
                // The others open (or reuse) HTTP/1.1 connections of their own.
                for r in requests.dropFirst() { serve(r, http1Only: false, fresh: false, into: &actions) }
            case .http2(let limit):
                var open = 0
                var rest = requests[...]
                let mayStream = isShared || !singleHTTP1Only
                if mayStream {
                    while let r = rest.first, open < limit {
                        rest = rest.dropFirst()
                        open += 1
                        actions.append(.openStream(id, for: r, reused: false))
                    }
                }
                connections[id.raw] = .multiplexing(open: open, limit: max(0, limit))
                http2.append(id)
                // Over the server's limit (or needing HTTP/1.1): another connection for the rest.
                for r in rest { serve(r, http1Only: singleHTTP1Only, fresh: false, into: &actions) }
            }
            return actions
        }

        // MARK: connection events

        /// The exchange is done with a leased HTTP/1.1 connection; `reusable`: its response ended
        /// cleanly and it can carry another request.
        public mutating func released(_ id: ConnectionID, reusable: Bool, now: UInt64) -> Release {
            guard case .leased = phase(id) else { return .close }
            guard reusable, idle.count < configuration.maxIdle else {
                forget(id)
                return .close
            }
            connections[id.raw] = .idle(since: now)
            idle.append(id)
            return .park(deadline: now &+ configuration.idleTimeout)
        }

        /// When the idle connection `id` is to close (nil: not idle).
        public func idleDeadline(_ id: ConnectionID) -> UInt64? {
            guard case .idle(let since) = phase(id) else { return nil }
            return since &+ configuration.idleTimeout
        }

        /// The idle connection's timer fired at `now`: true when it must close (it is then gone).
        public mutating func idleTimerFired(_ id: ConnectionID, now: UInt64) -> Bool {
            guard let end = idleDeadline(id) else { return false }
            guard now >= end else { return false }
            forget(id)
            return true
        }

        /// A stream handed out on `id` is done (closed on the wire, or never opened).
        public mutating func streamClosed(_ id: ConnectionID) {
            switch phase(id) {
            case .multiplexing(let open, let limit):
                connections[id.raw] = .multiplexing(open: max(0, open &- 1), limit: limit)
            case .goingAway(let open):
                connections[id.raw] = .goingAway(open: max(0, open &- 1))
            default:
                break
            }
        }

        /// The server's SETTINGS_MAX_CONCURRENT_STREAMS changed.
        public mutating func settingsChanged(_ id: ConnectionID, maxConcurrentStreams: Int) {
            guard case .multiplexing(let open, _) = phase(id) else { return }
            connections[id.raw] = .multiplexing(open: open, limit: max(0, maxConcurrentStreams))
        }

        /// GOAWAY on `id`: it takes no new streams.
        public mutating func goingAway(_ id: ConnectionID) {
            guard case .multiplexing(let open, _) = phase(id) else { return }
            http2.removeAll { $0 == id }
            connections[id.raw] = .goingAway(open: open)
        }

        /// The connection is gone (closed, failed, or became a tunnel that closed). Not for an
        /// attempt in flight (`connectFailed`).
        public mutating func connectionClosed(_ id: ConnectionID) {
            switch phase(id) {
            case .unused, .connecting: return
            default: forget(id)
            }
        }

        /// Shutting down: the connections to close (idle and HTTP/2 ones; leased ones close with
        /// their exchange).
        public mutating func closeAll() -> [ConnectionID] {
            let all = idle + http2
            for id in all { forget(id) }
            return all
        }

        // MARK: observation (tests, metrics)

        public var idleCount: Int { idle.count }
        public var http2Count: Int { http2.count }
        /// HTTP/2 connections taking streams with none open.
        public var idleHTTP2Count: Int { http2.reduce(0) { $0 + (isIdleHTTP2($1) ? 1 : 0) } }
        public var waitingCount: Int { waiting.count }
        /// Connections open or being opened.
        public var connectionCount: Int { connections.reduce(0) { $0 + ($1 == .unused ? 0 : 1) } }
        public var attemptCount: Int { singles.count + (shared == nil ? 0 : 1) }

        /// Streams open on `id` and its limit (nil: not an HTTP/2 connection).
        public func streams(_ id: ConnectionID) -> (open: Int, limit: Int?)? {
            switch phase(id) {
            case .multiplexing(let open, let limit): return (open, limit)
            case .goingAway(let open): return (open, nil)
            default: return nil
            }
        }

        /// An HTTP/2 connection with no open stream and taking streams.
        public func isIdleHTTP2(_ id: ConnectionID) -> Bool {
            if case .multiplexing(0, _) = phase(id) { return true }
            return false
        }

        // MARK: private

        private func phase(_ id: ConnectionID) -> Phase {
            id.raw >= 0 && id.raw < connections.count ? connections[id.raw] : .unused
        }

        private mutating func serve(_ request: RequestID, http1Only: Bool, fresh: Bool, into actions: inout [Action]) {
            if !fresh, let ready = takeReady(http1Only: http1Only) {
                switch ready {
                case .stream(let id): actions.append(.openStream(id, for: request, reused: true))
                case .idleConnection(let id, let since): actions.append(.lease(id, to: request, reused: true, idleSince: since))
                }
                return
            }
            if http1Only && configuration.http1Impossible {
                actions.append(.fail(request, .http1Impossible))
                return
            }
            if !http1Only && configuration.mayUseHTTP2 && knowledge != .http1 {
                // One connection that may speak HTTP/2 for every request that arrives meanwhile.
                if let id = shared, case .connecting(.shared(var list)) = connections[id.raw] {
                    list.append(request)
                    connections[id.raw] = .connecting(.shared(list))
                    waiting[request] = (id, false)
                    return
                }
                let id = allocate(.connecting(.shared([request])))
                shared = id
                waiting[request] = (id, false)
                actions.append(.connect(id, http1Only: false))
                return
            }
            // HTTP/1.1: one connection per request, but an attempt in flight whose request went
            // away is taken over instead of opening another (RFC 9113 §10.5).
            let anyProtocol = !configuration.mayUseHTTP2
            for id in singles {
                if case .connecting(.single(nil, let h1)) = connections[id.raw], h1 == http1Only || anyProtocol {
                    connections[id.raw] = .connecting(.single(request, http1Only: h1))
                    waiting[request] = (id, http1Only)
                    return
                }
            }
            let id = allocate(.connecting(.single(request, http1Only: http1Only)))
            singles.append(id)
            waiting[request] = (id, http1Only)
            actions.append(.connect(id, http1Only: http1Only))
        }

        /// A new connection with no request: idle in the pool, or closed when the pool is full.
        private mutating func park(_ id: ConnectionID, now: UInt64, into actions: inout [Action]) {
            guard idle.count < configuration.maxIdle else {
                forget(id)
                actions.append(.close(id))
                return
            }
            connections[id.raw] = .idle(since: now)
            idle.append(id)
            actions.append(.park(id))
        }

        private mutating func allocate(_ phase: Phase) -> ConnectionID {
            if let raw = freeIDs.popLast() {
                connections[raw] = phase
                return ConnectionID(raw)
            }
            connections.append(phase)
            return ConnectionID(connections.count - 1)
        }

        private mutating func removeAttempt(_ id: ConnectionID) {
            if shared == id { shared = nil }
            if let i = singles.firstIndex(of: id) { singles.remove(at: i) }
        }

        private mutating func forget(_ id: ConnectionID) {
            guard id.raw >= 0 && id.raw < connections.count, connections[id.raw] != .unused else { return }
            switch connections[id.raw] {
            case .idle: if let i = idle.lastIndex(of: id) { idle.remove(at: i) }
            case .multiplexing: http2.removeAll { $0 == id }
            case .connecting(let attempt):
                removeAttempt(id)
                for r in attempt.requests { waiting.removeValue(forKey: r) }
            default: break
            }
            connections[id.raw] = .unused
            freeIDs.append(id.raw)
        }
    }
}

extension BackendPool.StateMachine.Attempt {
    var requests: [BackendPool.RequestID] {
        switch self {
        case .shared(let list): return list
        case .single(let r, _): return r.map { [$0] } ?? []
        }
    }
}
