// STUB: replaced by the session driver work (owned by the session helper).
import BearerdIO
import Logging

/// All token sessions of a configuration.
public final class SessionManager: @unchecked Sendable {
    public init(config: BearerdConfig, logger: Logger, environment: [String: String]) throws(ConfigErrors) {}
    public func session(named name: String) -> TokenSessionDriver? { nil }
    public func start() {}
    public func reload(_ config: BearerdConfig, environment: [String: String]) throws(ConfigErrors) {}
    public func stop() {}
}

/// One token session's driver.
public final class TokenSessionDriver: @unchecked Sendable {
    public let name: String = ""
    public func usableToken(now: UInt64) -> PublishedToken? { nil }
    public func requestToken(on loop: EventLoop, completion: @escaping (Result<PublishedToken, TokenUnavailable>) -> Void) {}
    public func reportRejected(generation: UInt64, on loop: EventLoop, completion: @escaping (RejectionOutcome) -> Void) {}
    public var currentGeneration: UInt64 { 0 }
}
