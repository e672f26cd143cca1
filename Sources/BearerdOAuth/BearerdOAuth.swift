/// Sans-IO OAuth 2.0 token sessions (docs/architecture.md §6).
///
/// Everything in this module is a decision, none of it I/O: the token request and response
/// codecs (RFC 6749 §4.3, §4.4, §5.1, §5.2, §6), the token session state machine
/// (`TokenSession.StateMachine`), the 401 replay decision (`ReplayPolicy`), the rejection
/// breaker and the persisted-state format. Time and randomness are always parameters.
public enum BearerdOAuth {}
