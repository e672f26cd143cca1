import COpenSSL
import CBearerdShim
import Synchronization

/// The client TLS sessions kept for resumption (docs/architecture.md §2.3), one per peer, and the
/// handshake counts per peer. One cache per client `TLSContext` (so the TLS settings, CA, client
/// certificate and ALPN are part of the key by construction); the key within it is the peer's
/// `host:port` as verified (a session is offered only to the name it was verified for).
///
/// Owns: one reference to each kept `SSL_SESSION` (freed when replaced, dropped, or with the cache).
/// Any thread: a `Mutex` guards the table; OpenSSL's `SSL_set_session` takes its own reference, so a
/// session handed to a connection outlives its removal here.
///
/// Invariants: at most `capacity` peers (the oldest inserted is dropped first); a session that
/// failed to resume, or whose handshake failed, is dropped so the next connection does a full
/// handshake; only resumable sessions are kept (`SSL_SESSION_is_resumable`).
public final class TLSSessionCache: @unchecked Sendable {  // @unchecked: the raw SSL_SESSION pointers are only touched under `table`'s lock
    private struct Table {
        var sessions: [String: OpaquePointer] = [:]
        var order: [String] = []
    }
    private let table = Mutex<Table>(Table())
    public let capacity: Int

    public init(capacity: Int = 256) { self.capacity = max(1, capacity) }

    deinit {
        table.withLock { t in for s in t.sessions.values { SSL_SESSION_free(s) } }
    }

    /// Offers a copy of the kept session for `key` to `ssl` (before its handshake). True when one
    /// was set. A copy, because OpenSSL marks the session a connection holds not resumable when the
    /// connection is freed without close_notify; the kept one must stay usable for the next.
    func offer(to ssl: OpaquePointer, key: String) -> Bool {
        guard let copy = table.withLock({ t in t.sessions[key].flatMap { SSL_SESSION_dup($0) } }) else { return false }
        defer { SSL_SESSION_free(copy) }  // SSL_set_session takes its own reference
        return SSL_set_session(ssl, copy) == 1
    }

    /// Keeps `session` (whose reference the caller hands over) for `key`, replacing the previous one.
    func keep(_ session: OpaquePointer, key: String) {
        guard SSL_SESSION_is_resumable(session) == 1 else {
            SSL_SESSION_free(session)
            return
        }
        table.withLock { t in
            if let old = t.sessions.updateValue(session, forKey: key) {
                SSL_SESSION_free(old)
                return
            }
            t.order.append(key)
            if t.order.count > capacity {
                let evicted = t.order.removeFirst()
                if let s = t.sessions.removeValue(forKey: evicted) { SSL_SESSION_free(s) }
            }
        }
    }

    /// Drops the session kept for `key` (it failed to resume, or the handshake failed).
    func drop(key: String) {
        table.withLock { t in
            guard let s = t.sessions.removeValue(forKey: key) else { return }
            SSL_SESSION_free(s)
            t.order.removeAll { $0 == key }
        }
    }

    /// Peers with a session kept now.
    public var count: Int { table.withLock { $0.sessions.count } }
}

/// Handshakes of bearerd's TLS clients by peer and whether the session was resumed, for
/// `/metrics` (`bearerd_tls_handshakes_total`). Process-wide; any thread. Bounded: at most
/// `maxPeers` peers are counted separately, later ones under `other`.
public enum TLSHandshakeStats {
    public struct Counts: Sendable, Equatable {
        public var full: UInt64 = 0
        public var resumed: UInt64 = 0
        public init(full: UInt64 = 0, resumed: UInt64 = 0) { self.full = full; self.resumed = resumed }
    }
    public static let maxPeers = 512
    private static let table = Mutex<[String: Counts]>([:])

    static func record(peer: String, resumed: Bool) {
        table.withLock { t in
            let key = t[peer] != nil || t.count < maxPeers ? peer : "other"
            if resumed { t[key, default: Counts()].resumed &+= 1 } else { t[key, default: Counts()].full &+= 1 }
        }
    }

    /// Every peer's counts so far.
    public static var snapshot: [String: Counts] { table.withLock { $0 } }
}

/// OpenSSL's new-session callback: a session (or a TLS 1.3 ticket, which arrives after the
/// handshake) is kept in the engine's cache. A copy is kept: OpenSSL marks the connection's own
/// session not resumable when the connection is freed without close_notify, which an upstream
/// that closes after its response, or a pooled connection timing out, does all the time (nginx,
/// haproxy and Go keep the session at handshake time the same way). Returning 0 leaves the
/// original's reference to OpenSSL.
let newSessionCallback: @convention(c) (OpaquePointer?, OpaquePointer?) -> Int32 = { ssl, session in
    guard let ssl, let session, let raw = bearerd_SSL_get_app_data(ssl) else { return 0 }
    let engine = Unmanaged<TLSEngine>.fromOpaque(raw).takeUnretainedValue()
    guard let cache = engine.context.sessionCache, let key = engine.sessionKey,
          let copy = SSL_SESSION_dup(session) else { return 0 }
    cache.keep(copy, key: key)
    return 0
}
