import BearerdOAuth
import Logging

/// The configuration reference as data: every key the loader accepts, section by section, with
/// its type, default, a one-line description, an example and the page that explains it.
///
/// Two documents are generated from this one table: `docs/configuration.md` (`markdown()`) and
/// `docs/configuration.schema.json` (`jsonSchema()`, JSON Schema draft 2020-12, for editors).
/// Stateless; the table is immutable. Invariant (checked by ConfigReferenceTests): the section
/// paths and key names equal `ConfigKeys.sections` exactly, and enumerations are read from the
/// parser's own enums, so a key added to the loader without documentation fails a test.
public enum ConfigReference {
    /// The form a value takes, as the loader reads it.
    public indirect enum ValueType: Sendable {
        /// Any non-empty scalar (read as text).
        case text
        /// A file path: absolute, relative to the file's directory, `~/…`, or `credential:NAME` for `*_file` keys.
        case path
        /// An absolute `http://` or `https://` URL.
        case url
        /// `host:port`, `"[v6]:port"` or `unix:/absolute/path`.
        case address
        /// An environment variable name (letters, digits and `_`).
        case environmentName
        case boolean
        case integer(ClosedRange<Int>)
        /// A number from 0 to 1 (`sample_ratio`).
        case fraction
        /// A whole positive number and a unit (ms, s, m, h), at most `maximum` (as written: `24h`).
        case duration(maximum: String)
        /// Bytes, or a whole number with B, KiB, MiB or GiB, in `range` bytes.
        case size(ClosedRange<Int>)
        /// An octal file mode such as 0640 (at most 0777).
        case fileMode
        /// Exactly one of these words.
        case choice([String])
        /// Text matching a regular expression (ECMA-262 and Python `re` alike), described in words.
        case pattern(String, regex: String)
        /// One value or a list of at least `minItems` of them.
        case oneOrList(ValueType, minItems: Int = 1)
        /// A list of at least `minItems` values.
        case list(ValueType, minItems: Int = 1)
        /// A mapping of free names to values (`params`).
        case map(ValueType)
        /// A nested mapping: the section with this path.
        case section(String)
        /// Names (letters, digits, `.`, `_`, `-`) mapped to the section with this path (`sessions`).
        case namedSections(String)
        /// A list of mappings of the section with this path.
        case sectionList(String)
        /// One of several forms.
        case either([ValueType])
    }

    /// One key of one section.
    public struct Key: Sendable {
        public var name: String
        public var type: ValueType
        /// `none` when there is no default; `required` when the key must be given.
        public var defaultValue: String
        public var description: String
        /// As written in YAML after `name: `.
        public var example: String
        /// The page (and section) that explains it.
        public var see: String
    }

    /// One mapping of the file and the keys it accepts (any other key is refused).
    public struct Section: Sendable {
        /// Dotted location pattern, as in `ConfigKeys.sections`: `sessions.NAME.sinks[N]`.
        public var path: String
        /// Name of the schema definition (`$defs/<id>`).
        public var id: String
        public var summary: String
        public var keys: [Key]
    }

    static let durationExample = "500ms, 30s, 5m, 1h"
    static let timeout = ValueType.duration(maximum: "24h")
    static let lifetime = ValueType.duration(maximum: "8760h")
    static let ids = ValueType.oneOrList(.text, minItems: 0)
    /// Host names or origins; an empty list is accepted (nothing beyond the defaults).
    static let names = ValueType.oneOrList(.text, minItems: 0)
    static let sessionNamePattern = "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$"
    static let tokenTypeURI = ValueType.pattern("a token type URI (urn:… or https:…)", regex: "^[^ ]*:[^ ]*$")

    static func key(_ name: String, _ type: ValueType, _ defaultValue: String, _ description: String,
                    example: String, see: String) -> Key {
        Key(name: name, type: type, defaultValue: defaultValue, description: description, example: example, see: see)
    }

    /// `tls:` towards a token endpoint, an upstream or Redis.
    static func clientTLS(_ path: String, id: String, peer: String, see: String) -> Section {
        Section(path: path, id: id, summary: "TLS settings towards \(peer).", keys: [
            key("ca_file", .path, "none (system trust store only)", "A PEM CA added to the system trust store.",
                example: "/etc/ssl/private-ca.pem", see: see),
            key("client_cert", .path, "none", "Client certificate (PEM) for mutual TLS; needs client_key.",
                example: "/etc/bearerd/client.pem", see: see),
            key("client_key", .path, "none", "Private key (PEM) of client_cert; needs client_cert.",
                example: "/etc/bearerd/client.key", see: see),
        ])
    }

    static let access = "docs/http.md (Access control of the proxy listeners)"
    static let config = "docs/architecture.md §4"
    static let policy = "docs/architecture.md §6"
    static let workload = "docs/guides/workload-identity.md"
    static let kubernetes = "docs/guides/kubernetes-and-containers.md"
    static let tools = "docs/guides/curl-and-dev-tools.md"
    static let tour = "docs/configuration-tour.md"
    static let signing = "docs/guides/signing.md"
    static let callers = "docs/guides/on-behalf-of.md"
    static let traces = "docs/operations.md (Traces)"

    /// Every section, in the order of `ConfigKeys.sections`.
    public static let sections: [Section] = [
        Section(path: "(top level)", id: "bearerd", summary: "The top level of bearerd.yaml.", keys: [
            key("listen", .either([.address, .section("listen[N]"), .list(.either([.address, .section("listen[N]")]))]), "127.0.0.1:8080",
                "Where clients connect: one address or a list; each an address or a mapping with its access control.",
                example: "[127.0.0.1:8080, unix:/run/bearerd/api.sock]", see: access),
            key("admin", .address, "none", "Admin listener: GET /healthz, /readyz and /metrics; must differ from every listen address.",
                example: "127.0.0.1:9901", see: "docs/operations.md (Metrics)"),
            key("allow_remote", .boolean, "false", "Default of every TCP listener's allow_remote.", example: "false", see: access),
            key("allowed_hosts", names, "none", "Default of every TCP listener's allowed_hosts.", example: "[api.localhost]", see: access),
            key("allowed_origins", names, "none", "Default of every listener's allowed_origins.", example: "[https://app.example.com]", see: access),
            key("state_dir", .path, "none", "Directory for rotated refresh tokens, DPoP keys and discovery metadata (0700); required by grant refresh_token.",
                example: "/var/lib/bearerd", see: policy),
            key("loops", .integer(1...1024), "one per usable CPU", "Number of event loops (threads serving connections).",
                example: "2", see: "docs/architecture.md §2"),
            key("io", .choice(IOModeSetting.allCases.map(\.rawValue)), "poller ($BEARERD_IO when set)",
                "How loops learn that sockets are ready.", example: "poller", see: "bench/RESULTS.md"),
            key("limits", .section("limits"), "see limits", "Limits on client requests.", example: "{ headers: 100 }", see: "docs/http.md"),
            key("timeouts", .section("timeouts"), "see timeouts", "Client-side timeouts.", example: "{ idle: 60s }", see: "docs/http.md"),
            key("shutdown_grace", timeout, "10s", "On SIGTERM/SIGINT, time left for requests in flight (or timeouts.shutdown_grace, not both).",
                example: "10s", see: "docs/operations.md (Signals: reload and drain)"),
            key("startup_timeout", timeout, "30s", "Under systemd, the longest wait for every session's first token before READY=1.",
                example: "30s", see: "docs/guides/systemd.md"),
            key("log", .section("log"), "see log", "Log output on stderr.", example: "{ format: json }", see: "docs/operations.md (Logs)"),
            key("sessions", .namedSections("sessions.NAME"), "none", "OAuth 2.0 sessions by name (letters, digits, '.', '_', '-').",
                example: "{ partner: { grant: client_credentials, … } }", see: tour),
            key("routes", .sectionList("routes[N]"), "none", "Routes, tried in order; the first whose match (and host) fits wins.",
                example: "[{ match: /, upstream: http://127.0.0.1:9000 }]", see: config),
            key("outbound_proxy", .either([.choice(["env", "none"]), .url]), "none",
                "Forward proxy for token endpoints, issuers and upstreams: env (curl's variables), none, or http://[user:password@]host[:port].",
                example: "env", see: "docs/guides/outbound-proxy.md"),
            key("token_api", .section("token_api"), "none", "GET /v1/token/NAME for local programs.",
                example: "{ listen: unix:/run/bearerd/token.sock, sessions: [bound] }", see: tools),
            key("shared_cache", .section("shared_cache"), "none", "Replicas share one token per session through Redis or Valkey.",
                example: "{ url: redis://127.0.0.1:6379/0, key_file: … }", see: "docs/guides/replicas-redis.md"),
            key("tracing", .section("tracing"), "none (traces off)", "OpenTelemetry traces of proxied requests and token requests, exported over OTLP/HTTP.",
                example: "{ otlp_endpoint: http://127.0.0.1:4318/v1/traces }", see: traces),
        ]),
        Section(path: "listen[N]", id: "listener", summary: "A listener in the mapping form (an item of listen).", keys: [
            key("address", .address, "required (or unix)", "The address; required unless unix: is given.",
                example: "127.0.0.1:8080", see: access),
            key("unix", .pattern("an absolute socket path", regex: "^(unix:)?/"), "none", "Same as address: unix:PATH (not both).",
                example: "/run/bearerd/api.sock", see: access),
            key("name", .text, "none", "Matches a socket-activated fd by name (FileDescriptorName=); no ':' or spaces.",
                example: "api", see: "docs/guides/systemd.md"),
            key("mode", .fileMode, "0660", "Unix sockets: octal mode of the socket file.", example: "0660", see: access),
            key("owner", .text, "bearerd's own user", "Unix sockets: user (name or uid) owning the socket file.", example: "app", see: access),
            key("group", .text, "bearerd's own group", "Unix sockets: group (name or gid) of the socket file.", example: "app", see: access),
            key("allow_uids", ids, "none (anyone the file mode lets in)", "Unix sockets: peers let in by uid (SO_PEERCRED).",
                example: "[app, 1000]", see: access),
            key("allow_gids", ids, "none (anyone the file mode lets in)", "Unix sockets: peers let in by primary gid.",
                example: "[app]", see: access),
            key("allow_remote", .boolean, "the top-level allow_remote", "TCP: allow a non-loopback address.", example: "true", see: access),
            key("allowed_hosts", names, "the top-level allowed_hosts", "TCP: Host names accepted besides the built-in ones; \"*\" accepts any.",
                example: "[api.internal]", see: access),
            key("allowed_origins", names, "the top-level allowed_origins", "Web origins whose pages may call bearerd (browser guard).",
                example: "[\"http://localhost:5173\"]", see: access),
            key("tls", .section("listen[N].tls"), "none (plain HTTP)", "Serve HTTPS (ALPN h2, http/1.1) on this listener.",
                example: "{ cert: listener.pem, key: listener.key }", see: "docs/http.md"),
        ]),
        Section(path: "listen[N].tls", id: "listenerTLS", summary: "HTTPS on a listener.", keys: [
            key("cert", .path, "required", "PEM certificate chain the listener presents.", example: "/etc/bearerd/listener.pem", see: "docs/http.md"),
            key("key", .path, "required", "PEM private key of cert.", example: "/etc/bearerd/listener.key", see: "docs/http.md"),
        ]),
        Section(path: "log", id: "log", summary: "Log output (stderr); the command line and environment win over these keys.", keys: [
            key("format", .choice(LogFormat.allCases.map(\.rawValue)), "text", "text (key=value) or json (one object per line).",
                example: "json", see: "docs/operations.md (Logs)"),
            key("level", .choice(Logger.Level.allCases.map(\.rawValue)), "info", "Lowest level logged.", example: "info", see: "docs/operations.md (Logs)"),
            key("access", .boolean, "true", "One line per request.", example: "true", see: "docs/operations.md (Logs)"),
        ]),
        Section(path: "limits", id: "limits", summary: "Limits on client requests; a request over one is refused and its connection closed.", keys: [
            key("header_bytes", .size(1024...(16 << 20)), "64KiB", "Request line plus all header fields; over it: 431.", example: "64KiB", see: "docs/http.md"),
            key("request_target", .size(16...(16 << 20)), "8KiB", "Longest request target; over it: 414. At most header_bytes.", example: "8KiB", see: "docs/http.md"),
            key("headers", .integer(1...10_000), "100", "Most header fields in one request; over it: 431.", example: "100", see: "docs/http.md"),
        ]),
        Section(path: "timeouts", id: "timeouts", summary: "Client-side timeouts.", keys: [
            key("header_read", timeout, "10s", "Time to receive a complete request head (slowloris guard).", example: "10s", see: "docs/http.md"),
            key("idle", timeout, "60s", "Keep-alive time between two requests on one connection.", example: "60s", see: "docs/http.md"),
            key("shutdown_grace", timeout, "10s", "On SIGTERM/SIGINT, time left for requests in flight (or top-level shutdown_grace, not both).",
                example: "10s", see: "docs/operations.md (Signals: reload and drain)"),
        ]),
        Section(path: "sessions.NAME", id: "session", summary: "One OAuth 2.0 session; which keys apply depends on grant.", keys: [
            key("grant", .choice(GrantType.allCases.map(\.rawValue)), "required", "How tokens are obtained.", example: "client_credentials", see: tour),
            key("token_url", .url, "required unless issuer (or grant exec)", "The token endpoint, used exactly as written.",
                example: "https://auth.example.com/oauth2/token", see: tour),
            key("client_id", .text, "required (optional for jwt_bearer, token_exchange)", "The OAuth client identifier.", example: "my-service", see: tour),
            key("client_secret_file", .path, "none", "File holding the client secret (one trailing newline removed).",
                example: "/run/credentials/bearerd.service/partner", see: tour),
            key("client_secret_env", .environmentName, "none", "Environment variable holding the client secret.", example: "APP_SECRET", see: tour),
            key("client_secret", .text, "none", "The client secret itself (keep the file private).", example: "s3cr3t", see: tour),
            key("client_auth", .choice(ClientAuthentication.allCases.map(\.rawValue)),
                "client_secret_basic (none for jwt_bearer and token_exchange without a secret)",
                "How the client authenticates to the token endpoint.", example: "client_secret_post", see: workload),
            key("scope", .oneOrList(.text), "none (the server's default)", "Scopes, space-separated or as a list.", example: "read write", see: tour),
            key("params", .map(.text), "none", "Extra form parameters of the token request (not the ones bearerd sets).",
                example: "{ audience: https://api.example.com }", see: tour),
            key("refresh_before", lifetime, "the server's refresh_in, else half the lifetime up to 5m",
                "Start the background refresh this long before expiry.", example: "60s", see: policy),
            key("default_lifetime", lifetime, "300s", "Lifetime assumed when the server sends no expires_in and the token is no JWT.",
                example: "300s", see: policy),
            key("refresh_token_file", .path, "required for grant refresh_token", "The initial refresh token; rotated ones are kept in state_dir.",
                example: "/etc/bearerd/me.refresh", see: tour),
            key("username", .text, "required for grant password", "Resource owner's user name (grant password only).", example: "svc-user", see: tour),
            key("password", .text, "none", "The password itself (grant password).", example: "pa55word", see: tour),
            key("password_file", .path, "none", "File holding the password (grant password).",
                example: "/run/credentials/bearerd.service/svc-password", see: tour),
            key("password_env", .environmentName, "none", "Environment variable holding the password (grant password).", example: "SVC_PASSWORD", see: tour),
            key("tls", .section("sessions.NAME.tls"), "none", "TLS towards the token endpoint (https:// only).",
                example: "{ ca_file: /etc/ssl/private-ca.pem }", see: tour),
            key("request_timeout", timeout, "15s", "Timeout of one token request.", example: "15s", see: policy),
            key("wait_timeout", timeout, "10s", "Longest a client request waits for a token being refreshed; then 503.", example: "10s", see: policy),
            key("command", .list(.text), "required for grant exec", "grant exec: the program and its arguments (no shell).",
                example: "[/usr/local/bin/get-token, --audience, api]", see: workload),
            key("timeout", .duration(maximum: "10m"), "10s", "grant exec: the command is killed after this.", example: "10s", see: workload),
            key("issuer", .either([.url, .choice(["from_upstream"])]), "none",
                "Discovery (RFC 8414 / OpenID Connect) instead of token_url; from_upstream: the upstream names it (RFC 9728).",
                example: "https://auth.example.com", see: tour),
            key("allowed_issuers", .list(.url), "required with issuer: from_upstream",
                "The only authorization servers the upstream may name (https; http on loopback only).",
                example: "[https://auth.example.com]", see: "docs/guides/from-upstream.md"),
            key("client_key_file", .path, "required for private_key_jwt", "PEM private key (RSA ≥ 2048 or P-256) signing client assertions.",
                example: "/run/credentials/bearerd.service/svc-key.pem", see: workload),
            key("client_key_id", .text, "the key's RFC 7638 thumbprint", "The kid of private_key_jwt assertions.", example: "\"2026-11\"", see: workload),
            key("authorization_url", .url, "from issuer", "grant authorization_code: where the browser signs in.",
                example: "https://github.com/login/oauth/authorize", see: tools),
            key("device_authorization_url", .url, "from issuer", "grant device_code: the device authorization endpoint (RFC 8628).",
                example: "https://github.com/login/device/code", see: tools),
            key("redirect_uri", .url, "127.0.0.1 and a port chosen at run time", "grant authorization_code: a fixed loopback redirect URI.",
                example: "http://127.0.0.1:8765/callback", see: tools),
            key("assertion_file", .path, "required for grant jwt_bearer", "grant jwt_bearer: the JWT grant, re-read per request.",
                example: "/var/run/secrets/tokens/bearerd", see: kubernetes),
            key("audience", .oneOrList(.text), "none", "Audience parameters, one per value.", example: "https://api.example.com", see: kubernetes),
            key("resource", .oneOrList(.text), "none", "Resource indicators (RFC 8707), absolute URIs.", example: "https://api.example.com/", see: kubernetes),
            key("subject_token_file", .path, "none (this or subject_session for token_exchange)",
                "grant token_exchange: the subject token, re-read per request.", example: "/var/run/secrets/tokens/bearerd", see: kubernetes),
            key("subject_session", .pattern("a session name", regex: sessionNamePattern), "none",
                "grant token_exchange: another session whose access token is the subject token.", example: "k8s", see: workload),
            key("subject_token_type", tokenTypeURI, "…:jwt for a file, …:access_token for a subject_session",
                "grant token_exchange: type of the subject token.", example: "urn:ietf:params:oauth:token-type:jwt", see: kubernetes),
            key("actor_token_file", .path, "none", "grant token_exchange: the actor token (delegation), re-read per request.",
                example: "/etc/bearerd/actor.jwt", see: kubernetes),
            key("actor_token_type", tokenTypeURI, "urn:ietf:params:oauth:token-type:jwt", "grant token_exchange: type of the actor token.",
                example: "urn:ietf:params:oauth:token-type:jwt", see: kubernetes),
            key("requested_token_type", tokenTypeURI, "none", "grant token_exchange: the issued_token_type required of the response.",
                example: "urn:ietf:params:oauth:token-type:access_token", see: kubernetes),
            key("client_assertion_file", .path, "required for client_auth client_assertion",
                "An externally issued JWT sent as client_assertion, re-read per request.",
                example: "/var/run/secrets/azure/tokens/azure-identity-token", see: workload),
            key("dpop", .boolean, "false", "Bind tokens to a key bearerd holds (DPoP, RFC 9449).", example: "true", see: "docs/guides/dpop.md"),
            key("dpop_key_file", .path, "a P-256 key kept in state_dir", "PEM key (P-256 or RSA ≥ 2048) for DPoP proofs; needs dpop: true.",
                example: "/var/lib/bearerd/bound.dpop.pem", see: "docs/guides/dpop.md"),
            key("sinks", .sectionList("sessions.NAME.sinks[N]"), "none", "Files rewritten atomically with every new token.",
                example: "[{ path: /run/bearerd/bound.header, format: header }]", see: tools),
            key("region", .pattern("a region name", regex: "^[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?$"), "required for grant aws and aliyun",
                "grant aws / aliyun: the signing region (no oss- prefix).", example: "us-east-1", see: signing),
            key("sts_url", .url, "https://sts.REGION.amazonaws.com (aliyun: https://sts.REGION.aliyuncs.com)",
                "grant aws / aliyun: the STS that web_identity, assume_role and oidc_role call.", example: "https://sts.us-east-1.amazonaws.com", see: signing),
            key("credentials", .section("sessions.NAME.credentials"), "required for grant aws and aliyun",
                "grant aws / aliyun: where the signing keys come from (exactly one source).",
                example: "{ url: https://app.example.com/distribute-token.json }", see: signing),
            key("subject", .choice(["caller"]), "none (subject_token_file or subject_session)",
                "grant token_exchange: caller sends each incoming request's own bearer token as the subject token (on behalf of callers).",
                example: "caller", see: callers),
            key("assertion", .choice(["caller"]), "none (assertion_file)",
                "grant jwt_bearer: caller sends each incoming request's own bearer token as the assertion (Entra-style on-behalf-of).",
                example: "caller", see: callers),
            key("caller_cache", .section("sessions.NAME.caller_cache"), "{ max_entries: 10000 }",
                "subject/assertion caller: the bound of the per-caller cache of exchanged tokens.", example: "{ max_entries: 10000 }", see: callers),
            key("caller_jwt", .section("caller_jwt"), "none (the token endpoint judges the caller's token)",
                "subject/assertion caller: validate each caller's JWT before any exchange.",
                example: "{ issuer: https://login.example.com, jwks_url: https://login.example.com/jwks, audience: bearerd }", see: callers),
        ]),
        Section(path: "sessions.NAME.caller_cache", id: "callerCache", summary: "The per-caller cache of an on-behalf-of session.", keys: [
            key("max_entries", .integer(1...1_000_000), "10000",
                "Callers kept (least recently used evicted); about 1.2 KiB each for a 1 KiB token.", example: "10000", see: callers),
        ]),
        Section(path: "caller_jwt", id: "callerJWT",
                summary: "What a caller's bearer token must be (on a route, or on a session acting for callers).", keys: [
            key("issuer", .text, "required", "The tokens' iss, compared exactly.", example: "https://login.example.com", see: callers),
            key("audience", .text, "required", "A value the tokens' aud must contain.", example: "bearerd", see: callers),
            key("jwks_url", .url, "this or jwks_file",
                "The caller IdP's JWK Set: fetched at start, hourly, and on an unknown kid (at most once per 30 s); https (http on the loopback only).",
                example: "https://login.example.com/jwks", see: callers),
            key("jwks_file", .path, "this or jwks_url", "A local JWK Set file (re-read hourly and on an unknown kid).",
                example: "/etc/bearerd/caller-jwks.json", see: callers),
            key("leeway", .duration(maximum: "5m"), "60s", "Clock-skew allowance for exp, nbf and iat.", example: "30s", see: callers),
            key("ca_file", .path, "none (system trust store only)", "A PEM CA for an https jwks_url signed by a private CA.",
                example: "/etc/ssl/private-ca.pem", see: callers),
        ]),
        clientTLS("sessions.NAME.tls", id: "sessionTLS", peer: "the token endpoint", see: tour),
        Section(path: "routes[N]", id: "route", summary: "One route; the first whose match (and host) fits the request wins.", keys: [
            key("match", .pattern("a path prefix starting with /", regex: "^/"), "required", "Path prefix.", example: "/partner/", see: config),
            key("host", .text, "any host", "Only requests whose Host is this name (case-insensitive, port ignored).", example: "api.internal", see: config),
            key("strip_prefix", .boolean, "false", "Forward /partner/x as /x.", example: "true", see: config),
            key("upstream", .url, "required", "Where requests go: http(s)://host[:port][/base] (no query, fragment or user info).",
                example: "https://api.example.com/v2", see: config),
            key("session", .pattern("a session name", regex: sessionNamePattern), "none (no credentials injected)",
                "The session whose token is injected.", example: "partner", see: config),
            key("tls", .section("routes[N].tls"), "none", "Upstream TLS (https:// upstreams only).", example: "{ ca_file: /etc/ssl/private-ca.pem }", see: config),
            key("timeouts", .section("routes[N].timeouts"), "see routes[N].timeouts", "Upstream timeouts.", example: "{ connect: 2s }", see: config),
            key("replay_body_limit", .size(0...(1 << 30)), "1MiB", "Bodies up to this are kept to replay a rejected request once; 0: never.",
                example: "256KiB", see: "docs/http.md (How replay works, and its limits)"),
            key("reject_statuses", .oneOrList(.integer(400...599), minItems: 0), "[401]", "Status codes meaning \"token rejected\".",
                example: "[401, 403]", see: "docs/http.md (How replay works, and its limits)"),
            key("replay_methods", .either([.choice(["all"]), .list(.text, minItems: 0)]), "all", "Methods replayed after a refresh: all, or a list (case-sensitive).",
                example: "[GET, HEAD, PUT, DELETE]", see: "docs/http.md (How replay works, and its limits)"),
            key("http2", .choice(HTTP2Mode.allCases.map(\.rawValue)), "auto", "HTTP/2 towards the upstream.",
                example: "prior_knowledge", see: "docs/http.md (HTTP/2 on both sides)"),
            key("inject", .section("routes[N].inject"), "Authorization: Bearer {token}", "Where the session's token goes; needs session.",
                example: "{ header: X-Api-Key, format: \"{token}\" }", see: config),
            key("sign", .section("routes[N].sign"), "none (a token is injected)",
                "Sign requests with the session's keys (grant aws: SigV4; grant aliyun: OSS V4) instead of injecting a token.",
                example: "{ service: s3 }", see: signing),
            key("caller_jwt", .section("caller_jwt"), "none",
                "Only callers with a valid JWT get through (their token is replaced by the session's credential).",
                example: "{ issuer: https://login.example.com, jwks_url: https://login.example.com/jwks, audience: bearerd }", see: callers),
        ]),
        clientTLS("routes[N].tls", id: "routeTLS", peer: "the upstream", see: config),
        Section(path: "routes[N].timeouts", id: "routeTimeouts", summary: "Upstream timeouts of a route.", keys: [
            key("connect", timeout, "5s", "TCP connect plus TLS handshake.", example: "5s", see: config),
            key("response", timeout, "60s", "From request sent to response head, and between reads.", example: "60s", see: config),
            key("idle", timeout, "60s", "How long an idle pooled connection is kept.", example: "60s", see: config),
        ]),
        Section(path: "routes[N].inject", id: "inject", summary: "Where a route puts the session's token.", keys: [
            key("header", .pattern("a header name", regex: "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"), "Authorization",
                "Header name; bearerd's own headers (Host, Via, …) are refused.", example: "X-Api-Key", see: config),
            key("format", .text, "\"Bearer {token}\" (\"{token}\" for another header)", "Header value with {token} exactly once.",
                example: "\"Bearer {token}\"", see: config),
        ]),
        Section(path: "routes[N].sign", id: "sign", summary: "How a route signs requests (grant aws or aliyun sessions).", keys: [
            key("service", .pattern("a service name", regex: "^[a-z0-9.-]{1,64}$"), "required for grant aws; oss for aliyun",
                "The SigV4 service the upstream is (s3, execute-api, bedrock, …).", example: "s3", see: signing),
            key("bucket", .pattern("a bucket name", regex: "^[a-z0-9-]{3,63}$"), "from the host BUCKET.oss-REGION.aliyuncs.com",
                "OSS only: the bucket, when the upstream host does not name it.", example: "my-bucket", see: signing),
            key("payload", .choice(SignConfig.Payload.allCases.map(\.rawValue)), "unsigned for s3 and OSS, signed otherwise",
                "unsigned: bodies stream (UNSIGNED-PAYLOAD); signed: the body is hashed first (up to replay_body_limit, else 413).",
                example: "signed", see: signing),
        ]),
        Section(path: "sessions.NAME.credentials", id: "credentials", summary: "Where a signing session's keys come from: exactly one source.", keys: [
            key("web_identity", .section("sessions.NAME.credentials.web_identity"), "none",
                "grant aws: STS AssumeRoleWithWebIdentity with a projected token (EKS IRSA).",
                example: "{ role_arn: \"arn:aws:iam::123456789012:role/app\", token_file: /var/run/secrets/eks.amazonaws.com/serviceaccount/token }",
                see: signing),
            key("assume_role", .section("sessions.NAME.credentials.assume_role"), "none",
                "grant aws: STS AssumeRole signed with base keys from files.",
                example: "{ role_arn: \"arn:aws:iam::123456789012:role/app\", access_key_id_file: /etc/bearerd/ak, secret_access_key_file: /etc/bearerd/sk }",
                see: signing),
            key("url", .url, "none", "A vending endpoint (GET): container-credentials JSON or seed 004's accessKeyId/accessKeySecret/securityToken/expiration.",
                example: "http://169.254.170.23/v1/credentials", see: signing),
            key("url_headers", .map(.text), "none", "url: headers sent with every request.", example: "{ X-Team: storage }", see: signing),
            key("url_token_file", .path, "none", "url: a file whose content is sent as Authorization, re-read per request (EKS Pod Identity).",
                example: "/var/run/secrets/pods.eks.amazonaws.com/serviceaccount/eks-pod-identity-token", see: signing),
            key("exec", .list(.text), "none", "A helper printing credential_process JSON (Version 1); argv, no shell.",
                example: "[/usr/local/bin/creds, --profile, app]", see: signing),
            key("static", .section("sessions.NAME.credentials.static"), "none", "Keys from files, re-read every default_lifetime.",
                example: "{ access_key_id_file: /etc/bearerd/ak, secret_access_key_file: /etc/bearerd/sk }", see: signing),
            key("oidc_role", .section("sessions.NAME.credentials.oidc_role"), "none",
                "grant aliyun: STS AssumeRoleWithOIDC with a projected token (ACK RRSA).",
                example: "{ role_arn: \"acs:ram::123:role/app\", oidc_provider_arn: \"acs:ram::123:oidc-provider/ack\", token_file: /var/run/secrets/ack.alibabacloud.com/rrsa-tokens/token }",
                see: signing),
        ]),
        Section(path: "sessions.NAME.credentials.web_identity", id: "webIdentity", summary: "AWS STS AssumeRoleWithWebIdentity.", keys: [
            key("role_arn", .pattern("an ARN", regex: "^arn:"), "required", "The role to assume.", example: "\"arn:aws:iam::123456789012:role/app\"", see: signing),
            key("token_file", .path, "required", "The projected token, re-read for every call.",
                example: "/var/run/secrets/eks.amazonaws.com/serviceaccount/token", see: signing),
            key("session_name", .pattern("a role session name", regex: "^[A-Za-z0-9_+=,.@-]{2,64}$"), "bearerd", "RoleSessionName.", example: "orders", see: signing),
            key("duration", .duration(maximum: "12h"), "the role's default", "DurationSeconds (at least 15m).", example: "1h", see: signing),
        ]),
        Section(path: "sessions.NAME.credentials.assume_role", id: "assumeRole", summary: "AWS STS AssumeRole with base keys.", keys: [
            key("role_arn", .pattern("an ARN", regex: "^arn:"), "required", "The role to assume.", example: "\"arn:aws:iam::123456789012:role/app\"", see: signing),
            key("access_key_id_file", .path, "required", "File holding the base access key id.", example: "/etc/bearerd/ak", see: signing),
            key("secret_access_key_file", .path, "required", "File holding the base secret access key.", example: "/etc/bearerd/sk", see: signing),
            key("session_token_file", .path, "none", "File holding the base keys' session token, if they are temporary.", example: "/etc/bearerd/st", see: signing),
            key("external_id", .text, "none", "ExternalId the role's trust policy requires.", example: "partner-42", see: signing),
            key("session_name", .pattern("a role session name", regex: "^[A-Za-z0-9_+=,.@-]{2,64}$"), "bearerd", "RoleSessionName.", example: "orders", see: signing),
            key("duration", .duration(maximum: "12h"), "the role's default", "DurationSeconds (at least 15m).", example: "1h", see: signing),
        ]),
        Section(path: "sessions.NAME.credentials.static", id: "staticKeys", summary: "Keys from files.", keys: [
            key("access_key_id_file", .path, "required", "File holding the access key id.", example: "/etc/bearerd/ak", see: signing),
            key("secret_access_key_file", .path, "required", "File holding the secret access key.", example: "/etc/bearerd/sk", see: signing),
            key("session_token_file", .path, "none", "File holding a session token (STS keys).", example: "/etc/bearerd/st", see: signing),
        ]),
        Section(path: "sessions.NAME.credentials.oidc_role", id: "oidcRole", summary: "Alibaba Cloud STS AssumeRoleWithOIDC (ACK RRSA).", keys: [
            key("role_arn", .pattern("an ARN", regex: "^acs:ram::"), "required", "The RAM role to assume.", example: "\"acs:ram::123:role/app\"", see: signing),
            key("oidc_provider_arn", .pattern("an ARN", regex: "^acs:ram::"), "required", "The OIDC provider of the cluster.",
                example: "\"acs:ram::123:oidc-provider/ack\"", see: signing),
            key("token_file", .path, "required", "The projected token, re-read for every call.",
                example: "/var/run/secrets/ack.alibabacloud.com/rrsa-tokens/token", see: signing),
            key("session_name", .pattern("a role session name", regex: "^[A-Za-z0-9_+=,.@-]{2,64}$"), "bearerd", "RoleSessionName.", example: "orders", see: signing),
            key("duration", .duration(maximum: "12h"), "the role's default", "DurationSeconds (at least 15m).", example: "1h", see: signing),
        ]),
        Section(path: "sessions.NAME.sinks[N]", id: "sink", summary: "A file other programs read, rewritten with every new token.", keys: [
            key("path", .path, "required", "The file; a missing directory is created 0750.", example: "/run/bearerd/bound.header", see: tools),
            key("mode", .fileMode, "0640", "Octal mode, applied exactly; never world-writable.", example: "0640", see: tools),
            key("format", .choice(SinkFormat.allCases.map(\.rawValue)), "token", "token alone, the header line, or JSON.", example: "header", see: tools),
        ]),
        Section(path: "token_api", id: "tokenAPI", summary: "GET /v1/token/NAME for local programs.", keys: [
            key("listen", .address, "required", "unix:/path, or a loopback 127.0.0.1:PORT / \"[::1]:PORT\".",
                example: "unix:/run/bearerd/token.sock", see: tools),
            key("sessions", .oneOrList(.pattern("a session name", regex: sessionNamePattern)), "required", "The only sessions served (others get 404).",
                example: "[bound]", see: tools),
            key("allowed_uids", ids, "bearerd's own uid", "Unix sockets: user names or uids allowed.", example: "[1000]", see: tools),
            key("authorization_token_file", .path, "none",
                "GET /v1/credentials/NAME: the Authorization callers must send (AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE); then TCP callers need no Bearerd-Token-Request.",
                example: "/run/bearerd/credentials.token", see: signing),
        ]),
        Section(path: "shared_cache", id: "sharedCache", summary: "One token per session shared by replicas through Redis or Valkey.", keys: [
            key("url", .pattern("redis://…, rediss://… or unix:/path", regex: "^(redis://|rediss://|unix:/)"), "required",
                "The Redis or Valkey server.", example: "redis://127.0.0.1:6379/0", see: "docs/guides/replicas-redis.md"),
            key("key_file", .path, "required", "32 random bytes as base64 (the same file on every replica).",
                example: "/run/credentials/bearerd.service/cache-key", see: "docs/guides/replicas-redis.md"),
            key("prefix", .text, "\"bearerd:\"", "Prefix of every Redis key.", example: "\"bearerd:\"", see: "docs/guides/replicas-redis.md"),
            key("password_file", .path, "none", "AUTH password (instead of the URL's).",
                example: "/run/credentials/bearerd.service/redis-password", see: "docs/guides/replicas-redis.md"),
            key("tls", .section("shared_cache.tls"), "none", "TLS towards Redis (rediss://).", example: "{ ca_file: /etc/ssl/redis-ca.pem }",
                see: "docs/guides/replicas-redis.md"),
        ]),
        clientTLS("shared_cache.tls", id: "sharedCacheTLS", peer: "Redis (rediss://)", see: "docs/guides/replicas-redis.md"),
        Section(path: "tracing", id: "tracing", summary: "OpenTelemetry traces exported over OTLP/HTTP (protobuf); off without this section.", keys: [
            key("otlp_endpoint", .url, "required", "The collector's OTLP/HTTP traces URL (a URL without a path gets /v1/traces).",
                example: "http://127.0.0.1:4318/v1/traces", see: traces),
            key("sample_ratio", .fraction, "1", "Share of traces started here that are recorded; a caller's sampled traceparent is always honoured.",
                example: "0.01", see: traces),
            key("headers_file", .path, "none", "Name: value lines sent with every export (an API key; a secret, never logged).",
                example: "/run/credentials/bearerd.service/otlp-headers", see: traces),
        ]),
    ]

    static func section(_ path: String) -> Section? { sections.first { $0.path == path } }

    // MARK: - Type names

    /// The type in words, for the reference table.
    static func describe(_ type: ValueType) -> String {
        switch type {
        case .text: return "string"
        case .path: return "path"
        case .url: return "URL"
        case .address: return "address"
        case .environmentName: return "environment variable name"
        case .boolean: return "boolean"
        case .integer(let r): return "integer \(r.lowerBound)–\(r.upperBound)"
        case .fraction: return "number 0–1"
        case .duration(let maximum): return "duration (at most \(maximum))"
        case .size(let r): return "size (\(r.lowerBound == 0 ? "0" : ConfigValues.describe(bytes: r.lowerBound))–\(ConfigValues.describe(bytes: r.upperBound)))"
        case .fileMode: return "octal file mode"
        case .choice(let values): return "one of " + values.map { "`\($0)`" }.joined(separator: ", ")
        case .pattern(let words, _): return words
        case .oneOrList(let t, _): return "\(describe(t)), or a list of them"
        case .list(let t, _):
            if case .either = t { return "list of (\(describe(t)))" }
            return "list of \(describe(t))"
        case .map(let t): return "mapping of names to \(describe(t))"
        case .section(let p): return "mapping ([\(p)](#\(anchor(p))))"
        case .namedSections(let p): return "mapping of names to [\(p)](#\(anchor(p)))"
        case .sectionList(let p): return "list of [\(p)](#\(anchor(p)))"
        case .either(let forms): return forms.map(describe).joined(separator: " or ")
        }
    }

    /// GitHub's heading anchor of `## \`path\``.
    static func anchor(_ path: String) -> String {
        String(path.lowercased().compactMap { c -> Character? in
            if c == " " { return "-" }
            return c.isLetter || c.isNumber || c == "_" || c == "-" ? c : nil
        })
    }

    // MARK: - Markdown

    /// The text of `docs/configuration.md`.
    public static func markdown() -> String {
        var out = """
        # Configuration reference

        <!-- Generated from Sources/BearerdConfig/ConfigReference.swift: do not edit by hand.
             Regenerate with: swift run bearerd config reference > docs/configuration.md -->

        Every key of `bearerd.yaml`, section by section. Generated from the same table as the JSON
        Schema [configuration.schema.json](configuration.schema.json) (`bearerd config schema`), which
        editors use for completion and checks: `config.example.yaml` starts with
        `# yaml-language-server: $schema=docs/configuration.schema.json`. The commented example
        [config.example.yaml](../config.example.yaml) shows them in use; `bearerd check -c FILE` is the
        authority (it also checks what a schema cannot: files, cross-key rules, session references).

        Unknown keys, repeated keys and empty values (`key:` with nothing after it) are errors.

        Syntax of values:

        | Type | Form |
        |---|---|
        | duration | a whole positive number and a unit: \(durationExample) (ms, s, m, h); at most the key's maximum |
        | size | bytes (65536) or a whole number and a binary unit: 512B, 64KiB, 1MiB, 1GiB |
        | address | host:port, "[v6]:port" (quoted), unix:/absolute/path |
        | path | absolute, relative to the file's directory, or ~/…; `*_file` keys and tls files also take credential:NAME ($CREDENTIALS_DIRECTORY/NAME) |
        | octal file mode | 0640, 0660, … (at most 0777) |


        """
        for section in sections {
            out += "## `\(section.path)`\n\n\(section.summary)\n\n"
            out += "| Key | Type | Default | Description | Example | See |\n|---|---|---|---|---|---|\n"
            for k in section.keys {
                let cells = ["`\(k.name)`", describe(k.type), k.defaultValue, k.description, "`\(k.example)`", k.see]
                out += "| " + cells.map { $0.replacingOccurrences(of: "|", with: "\\|") }.joined(separator: " | ") + " |\n"
            }
            out += "\n"
        }
        out += """
        ## What the schema does not check

        `bearerd check` also refuses, beyond what the schema expresses: keys that do not fit the
        session's grant or client_auth (e.g. refresh_token_file without grant refresh_token), a missing
        secret or key the grant needs, exactly-one-of rules (client_secret forms, password forms,
        token_url or issuer, address or unix, subject_token_file or subject_session), unknown session
        names in routes, token_api and subject_session (and cycles), routes shadowed by earlier ones,
        tls on http:// endpoints, shutdown_grace set twice, request_target above header_bytes, a
        non-loopback listener without allow_remote, durations above their maximum, files that cannot
        be read, and values the YAML reader types differently (the loader reads scalars as text, so
        `loops: "2"` is accepted by `check` but not by the schema).

        """
        return out
    }

    // MARK: - JSON Schema

    /// The text of `docs/configuration.schema.json` (JSON Schema draft 2020-12), sorted keys, 2-space indent.
    public static func jsonSchema() -> String {
        var defs: [(String, JSONValue)] = []
        for s in sections where s.path != "(top level)" { defs.append((s.id, schema(of: s))) }
        guard let top = section("(top level)") else { return "" }
        var root = schemaMembers(of: top).filter { $0.0 != "description" }
        root += [
            ("$schema", .string("https://json-schema.org/draft/2020-12/schema")),
            ("$id", .string("urn:bearerd:configuration")),
            ("title", .string("bearerd configuration (bearerd.yaml)")),
            ("description", .string("Generated from Sources/BearerdConfig/ConfigReference.swift by `bearerd config schema`; see docs/configuration.md.")),
            ("$defs", .object(defs)),
        ]
        return JSONValue.object(root).rendered() + "\n"
    }

    static func schema(of section: Section) -> JSONValue { .object(schemaMembers(of: section)) }

    static func schemaMembers(of section: Section) -> [(String, JSONValue)] {
        [
            ("type", .string("object")),
            ("description", .string(section.summary)),
            ("additionalProperties", .bool(false)),
            ("properties", .object(section.keys.map { k in
                var s = schemaMembers(of: k.type)
                s.append(("description", .string(k.description + (k.defaultValue == "none" ? "" : " Default: \(k.defaultValue)."))))
                return (k.name, .object(s))
            })),
        ]
    }

    static func ref(_ path: String) -> JSONValue {
        .object([("$ref", .string("#/$defs/" + (section(path)?.id ?? path)))])
    }

    static func schema(of type: ValueType) -> JSONValue { .object(schemaMembers(of: type)) }

    static let durationRegex = "^0*[1-9][0-9]*(ms|s|m|h)$"

    static func schemaMembers(of type: ValueType) -> [(String, JSONValue)] {
        let nonEmptyString: [(String, JSONValue)] = [("type", .string("string")), ("minLength", .int(1))]
        switch type {
        case .text:
            // The loader reads any scalar as text: `client_id: 12345` is the string "12345".
            return [("type", .array([.string("string"), .string("number")])), ("minLength", .int(1))]
        case .path: return nonEmptyString
        case .url: return [("type", .string("string")), ("pattern", .string("^[hH][tT][tT][pP][sS]?://[^/?#]+"))]
        case .address:
            return [("type", .string("string")),
                    ("pattern", .string("^(unix:/.+|\\[[0-9A-Fa-f:.]+(%[^\\]]+)?\\]:[0-9]{1,5}|[A-Za-z0-9_][A-Za-z0-9._-]*:[0-9]{1,5})$"))]
        case .environmentName: return [("type", .string("string")), ("pattern", .string("^[A-Za-z0-9_]+$"))]
        case .boolean: return [("type", .string("boolean"))]
        case .integer(let r): return [("type", .string("integer")), ("minimum", .int(r.lowerBound)), ("maximum", .int(r.upperBound))]
        case .fraction: return [("type", .string("number")), ("minimum", .int(0)), ("maximum", .int(1))]
        case .duration:
            return [("type", .string("string")), ("pattern", .string(durationRegex))]
        case .size(let r):
            return [("oneOf", .array([
                .object([("type", .string("integer")), ("minimum", .int(r.lowerBound)), ("maximum", .int(r.upperBound))]),
                .object([("type", .string("string")), ("pattern", .string("^[0-9]+(B|KiB|MiB|GiB)?$"))]),
            ]))]
        case .fileMode:
            // A YAML reader turns 0640 into a number (octal in YAML 1.1, 640 in YAML 1.2).
            return [("oneOf", .array([
                .object([("type", .string("integer")), ("minimum", .int(0))]),
                .object([("type", .string("string")), ("pattern", .string("^(0[oO])?[0-7]+$"))]),
            ]))]
        case .choice(let values): return [("enum", .array(values.map { .string($0) }))]
        case .pattern(_, let regex): return [("type", .string("string")), ("pattern", .string(regex))]
        case .oneOrList(let t, let minItems):
            return [("oneOf", .array([schema(of: t), schema(of: .list(t, minItems: minItems))]))]
        case .list(let t, let minItems):
            return [("type", .string("array")), ("items", schema(of: t))] + (minItems > 0 ? [("minItems", .int(minItems))] : [])
        case .map(let t): return [("type", .string("object")), ("additionalProperties", schema(of: t))]
        case .section(let p):
            guard case .object(let members) = ref(p) else { return [] }
            return members
        case .namedSections(let p):
            return [("type", .string("object")), ("patternProperties", .object([(sessionNamePattern, ref(p))])),
                    ("additionalProperties", .bool(false))]
        case .sectionList(let p): return [("type", .string("array")), ("items", ref(p))]
        case .either(let forms): return [("oneOf", .array(forms.map(schema(of:))))]
        }
    }
}

/// A JSON value rendered deterministically: object keys sorted by code point, 2-space indent.
enum JSONValue {
    case string(String)
    case int(Int)
    case bool(Bool)
    case array([JSONValue])
    case object([(String, JSONValue)])

    func rendered(indent: Int = 0) -> String {
        let pad = String(repeating: " ", count: indent + 2), closing = String(repeating: " ", count: indent)
        switch self {
        case .string(let s): return Self.quote(s)
        case .int(let n): return String(n)
        case .bool(let b): return b ? "true" : "false"
        case .array(let items):
            if items.isEmpty { return "[]" }
            return "[\n" + items.map { pad + $0.rendered(indent: indent + 2) }.joined(separator: ",\n") + "\n\(closing)]"
        case .object(let members):
            if members.isEmpty { return "{}" }
            let sorted = members.sorted { Array($0.0.unicodeScalars.map(\.value)).lexicographicallyPrecedes($1.0.unicodeScalars.map(\.value)) }
            return "{\n" + sorted.map { pad + Self.quote($0.0) + ": " + $0.1.rendered(indent: indent + 2) }.joined(separator: ",\n") + "\n\(closing)}"
        }
    }

    /// A JSON string literal: the project's one writer (`JSONWriter.quote`, RFC 8259 §7).
    static func quote(_ s: String) -> String { JSONWriter.quote(s) }
}
