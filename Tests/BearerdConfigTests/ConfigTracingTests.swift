// `tracing:` (docs/architecture.md §2.9): the endpoint, the ratio, the headers file, errors as FILE:LINE: key.

import Foundation
import Testing
@testable import BearerdConfig

@Suite struct ConfigTracingTests {
    func load(_ yaml: String, dir: String) throws(ConfigErrors) -> BearerdConfig {
        try ConfigLoader.parse(yaml: yaml, file: dir + "/bearerd.yaml", environment: [:])
    }

    func tempDir() throws -> String {
        let dir = NSTemporaryDirectory() + "bearerd-cfg-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        return dir
    }

    static let routes = """
    routes:
      - { match: /, upstream: "http://127.0.0.1:9000" }
    """

    @Test func offByDefault() throws {
        let config = try load(Self.routes, dir: try tempDir())
        #expect(config.tracing == nil)
    }

    @Test func sectionWithDefaultsAndPath() throws {
        let dir = try tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try "# the collector's key\nAuthorization: Api-Key s3cret-value\r\n\nX-Scope-OrgID:  team-a  \n".write(toFile: dir + "/otlp", atomically: true, encoding: .utf8)
        let config = try load("""
        tracing:
          otlp_endpoint: http://127.0.0.1:4318
          headers_file: otlp
        \(Self.routes)
        """, dir: dir)
        let tracing = try #require(config.tracing)
        // A URL without a path gets the OTLP/HTTP traces path.
        #expect(tracing.endpoint.path == "/v1/traces")
        #expect(tracing.endpoint.authority == "127.0.0.1:4318")
        #expect(tracing.sampleRatio == 1)
        #expect(tracing.headersFile == dir + "/otlp")
        let headers = try tracing.readHeaders().get()
        #expect(headers.map(\.name) == ["Authorization", "X-Scope-OrgID"])
        #expect(headers.map(\.value) == ["Api-Key s3cret-value", "team-a"])

        let explicit = try load("""
        tracing: { otlp_endpoint: "https://otel.example.com/custom/traces", sample_ratio: 0.01 }
        \(Self.routes)
        """, dir: dir)
        #expect(explicit.tracing?.endpoint.path == "/custom/traces")
        #expect(explicit.tracing?.endpoint.scheme == "https")
        #expect(explicit.tracing?.sampleRatio == 0.01)
    }

    @Test func errorsNameFileLineAndKeyNeverTheHeaderValue() throws {
        let dir = try tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try "Authorization: Api-Key hunter2\nno colon here hunter3\n".write(toFile: dir + "/otlp", atomically: true, encoding: .utf8)
        do {
            _ = try load("""
            tracing:
              otlp_endpoint: ftp://collector
              sample_ratio: 1.5
              headers_file: otlp
              sample_rate: 1
            \(Self.routes)
            """, dir: dir)
            Issue.record("expected errors")
        } catch {
            let text = error.errors.map(\.description).joined(separator: "\n")
            #expect(text.contains("bearerd.yaml:2: tracing.otlp_endpoint: expected an http:// or https:// URL"), "\(text)")
            #expect(text.contains("bearerd.yaml:3: tracing.sample_ratio: expected a number from 0 to 1"), "\(text)")
            #expect(text.contains("bearerd.yaml:4: tracing.headers_file: \(dir)/otlp: line 2: expected Name: value"), "\(text)")
            #expect(text.contains("bearerd.yaml:5: tracing.sample_rate: unknown key (did you mean 'sample_ratio'?)"), "\(text)")
            #expect(!text.contains("hunter"), "\(text)")
        }
        do {
            _ = try load("tracing: { sample_ratio: 0 }\n" + Self.routes, dir: dir)
            Issue.record("expected errors")
        } catch {
            let text = error.errors.map(\.description).joined(separator: "\n")
            #expect(text.contains("bearerd.yaml:1: tracing.otlp_endpoint: missing required key"), "\(text)")
        }
        for bad in ["nan", "-0.1", "inf", "1e3", "half"] {
            #expect(throws: ConfigErrors.self, "\(bad)") {
                _ = try load("tracing: { otlp_endpoint: http://h:4318, sample_ratio: \(bad) }\n" + Self.routes, dir: dir)
            }
        }
    }

    @Test func headersFileRefusesFieldsBearerdSetsAndControlCharacters() {
        func problem(_ text: String) -> String? {
            if case .failure(let e) = TracingConfig.parseHeaders(Array(text.utf8)) { return e.message }
            return nil
        }
        #expect(problem("Content-Type: text/plain\n") == "line 1: Content-Type: bearerd sets this header itself")
        #expect(problem("X-Key: a\u{1}b\n") == "line 1: X-Key: a header value must not contain control characters")
        #expect(problem("Bad Name: v\n") == "line 1: not a valid header name (RFC 9110 token)")
        #expect(problem("# only a comment\n\n") == nil)
    }
}
