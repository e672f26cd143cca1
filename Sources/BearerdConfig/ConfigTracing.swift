/// `tracing:` (docs/architecture.md §2.9): OpenTelemetry traces exported over OTLP/HTTP
/// (protobuf). Off unless the section is given.
public struct TracingConfig: Sendable, Equatable {
    /// The collector's OTLP/HTTP traces URL; a URL without a path gets `/v1/traces`.
    public var endpoint: EndpointURL
    /// Traces started here (no sampled `traceparent` from the caller) that are recorded, 0…1.
    public var sampleRatio: Double
    /// `Name: value` lines sent with every export (an API key: a secret, never logged).
    public var headersFile: String?
    /// Line of `tracing:` (for errors at start-up).
    public var line: Int

    public init(endpoint: EndpointURL, sampleRatio: Double = 1, headersFile: String? = nil, line: Int = 0) {
        self.endpoint = endpoint
        self.sampleRatio = sampleRatio
        self.headersFile = headersFile
        self.line = line
    }

    /// The fields bearerd sets itself on an export request: refused in `headers_file`.
    static let reservedHeaders: Set<String> = ["host", "content-length", "content-type", "transfer-encoding", "connection", "user-agent"]

    /// The fields of a headers file: `Name: value` per line; blank lines and lines starting
    /// with `#` are skipped. Errors name the line, never the value.
    public static func parseHeaders(_ bytes: [UInt8]) -> Result<[(name: String, value: String)], ConfigValueError> {
        var out: [(name: String, value: String)] = []
        var lineNumber = 0
        for rawLine in bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false) {
            lineNumber += 1
            var line = rawLine[...]
            if line.last == UInt8(ascii: "\r") { line = line.dropLast() }
            let trimmed = line.drop { $0 == 0x20 || $0 == 0x09 }
            if trimmed.isEmpty || trimmed.first == UInt8(ascii: "#") { continue }
            guard let colon = line.firstIndex(of: UInt8(ascii: ":")) else {
                return .failure(ConfigValueError("line \(lineNumber): expected Name: value"))
            }
            let name = String(decoding: line[line.startIndex..<colon], as: UTF8.self)
            guard ConfigBuilder.isToken(name) else {
                return .failure(ConfigValueError("line \(lineNumber): not a valid header name (RFC 9110 token)"))
            }
            guard !reservedHeaders.contains(name.lowercased()) else {
                return .failure(ConfigValueError("line \(lineNumber): \(name): bearerd sets this header itself"))
            }
            var value = line[line.index(after: colon)...]
            while let f = value.first, f == 0x20 || f == 0x09 { value = value.dropFirst() }
            while let l = value.last, l == 0x20 || l == 0x09 { value = value.dropLast() }
            guard !value.contains(where: { ($0 < 0x20 && $0 != 0x09) || $0 == 0x7F }) else {
                return .failure(ConfigValueError("line \(lineNumber): \(name): a header value must not contain control characters"))
            }
            out.append((name, String(decoding: value, as: UTF8.self)))
        }
        return .success(out)
    }

    /// The headers of `headers_file` (none without one), or why they cannot be read (`PATH: …`).
    /// Read at start-up and by `bearerd check`.
    public func readHeaders() -> Result<[(name: String, value: String)], ConfigValueError> {
        guard let headersFile else { return .success([]) }
        let bytes: [UInt8]
        do throws(ConfigFiles.Failure) {
            bytes = try ConfigFiles.readAll(headersFile, limit: 64 * 1024)
        } catch {
            return .failure(ConfigValueError("cannot read \(headersFile): \(error.reason)"))
        }
        return Self.parseHeaders(bytes).mapError { ConfigValueError("\(headersFile): \($0.message)") }
    }
}

extension ConfigBuilder {
    /// `tracing:` → `TracingConfig`, every problem reported as FILE:LINE: key.
    func tracingSection(_ entry: Entry) -> TracingConfig? {
        guard let f = fields(entry.value, path: "tracing", line: entry.keyLine, known: ConfigKeys.tracing,
                             expected: "a mapping (otlp_endpoint, sample_ratio, headers_file)") else { return nil }
        var endpoint: EndpointURL?
        if f["otlp_endpoint"] == nil {
            missing(f, "otlp_endpoint", "the collector's OTLP/HTTP URL, e.g. http://127.0.0.1:4318/v1/traces")
        } else if let url = parsed(f, "otlp_endpoint", expected: "an http:// or https:// URL", { (raw: String) throws(ConfigValues.Problem) -> EndpointURL in
            try ConfigValues.endpointURL(raw, allowQuery: true)
        }) {
            endpoint = url.path.isEmpty || url.path == "/"
                ? EndpointURL(scheme: url.scheme, host: url.host, port: url.port, path: "/v1/traces", query: url.query) : url
        }
        var ratio = 1.0
        if f["sample_ratio"] != nil, let r = parsed(f, "sample_ratio", expected: "a number from 0 to 1", { (raw: String) throws(ConfigValues.Problem) -> Double in
            guard let d = Double(raw), d.isFinite, (0...1).contains(d) else {
                throw ConfigValues.Problem("expected a number from 0 to 1 (0.01: one trace in a hundred), got \(ConfigValues.quoted(raw))")
            }
            return d
        }) {
            ratio = r
        }
        let headersFile = path(f, "headers_file", mustRead: true)
        if checkFiles, let headersFile, let e = f["headers_file"] {
            if case .failure(let why) = TracingConfig(endpoint: EndpointURL(scheme: "http", host: "x", port: 80, path: ""),
                                                      headersFile: headersFile).readHeaders() {
                fail(e.valueLine, f.key("headers_file"), why.message)
            }
        }
        guard let endpoint else { return nil }
        return TracingConfig(endpoint: endpoint, sampleRatio: ratio, headersFile: headersFile, line: entry.keyLine)
    }
}
