/// Sans-IO OAuth 2.0 token sessions (shared/DESIGN.md §6). Filled in by the token-session work.
public enum BearerdOAuth {
    public static let version = "0.1.0"
}
