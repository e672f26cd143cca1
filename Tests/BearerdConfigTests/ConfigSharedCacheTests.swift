// `shared_cache:` (docs/architecture.md §4): URLs, key files, errors located as FILE:LINE: key.

import Foundation
import Testing
@testable import BearerdConfig

@Suite struct ConfigSharedCacheTests {
    func load(_ yaml: String, dir: String) throws(ConfigErrors) -> BearerdConfig {
        try ConfigLoader.parse(yaml: yaml, file: dir + "/bearerd.yaml", environment: [:])
    }

    func tempDir() throws -> String {
        let dir = NSTemporaryDirectory() + "bearerd-cfg-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        return dir
    }

    @Test func urls() throws {
        func parsed(_ s: String) -> SharedCacheConfig.ParsedURL? { try? SharedCacheConfig.parseURL(s).get() }
        #expect(parsed("redis://127.0.0.1:6379/0") == .init(endpoint: .tcp(host: "127.0.0.1", port: 6379, tls: false), database: 0))
        #expect(parsed("rediss://cache.internal/2") == .init(endpoint: .tcp(host: "cache.internal", port: 6379, tls: true), database: 2))
        #expect(parsed("redis://bob:p%40ss@[::1]:7000/1") == .init(endpoint: .tcp(host: "::1", port: 7000, tls: false), database: 1,
                                                                  username: "bob", password: "p@ss"))
        #expect(parsed("redis://:only-password@h:1") == .init(endpoint: .tcp(host: "h", port: 1, tls: false), database: 0, password: "only-password"))
        #expect(parsed("unix:/run/redis.sock?db=4") == .init(endpoint: .unix(path: "/run/redis.sock"), database: 4))
        #expect(parsed("unix:///run/redis.sock") == .init(endpoint: .unix(path: "/run/redis.sock"), database: 0))
        for bad in ["http://h:1", "redis://h:0", "redis://h:99999", "redis://h/x", "redis://", "unix:relative", "unix:/s?db=x"] {
            #expect(parsed(bad) == nil, "\(bad)")
        }
    }

    @Test func sectionParsesWithDefaults() throws {
        let dir = try tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n".write(toFile: dir + "/key", atomically: true, encoding: .utf8)
        let config = try load("""
        shared_cache:
          url: redis://user:pw@127.0.0.1:6380/2
          key_file: key
        routes:
          - { match: /, upstream: "http://127.0.0.1:9000" }
        """, dir: dir)
        let shared = try #require(config.sharedCache)
        #expect(shared.endpoint == .tcp(host: "127.0.0.1", port: 6380, tls: false))
        #expect(shared.database == 2)
        #expect(shared.username == "user")
        #expect(shared.password == .literal(Secret("pw")))
        #expect(shared.prefix == "bearerd:")
        #expect(shared.keyFile == dir + "/key")
    }

    @Test func errorsNameFileLineAndKeyNeverThePassword() throws {
        let dir = try tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try "too short".write(toFile: dir + "/key", atomically: true, encoding: .utf8)
        try "pw".write(toFile: dir + "/pw", atomically: true, encoding: .utf8)
        do {
            _ = try load("""
            shared_cache:
              url: redis://u:hunter2@127.0.0.1:99999/0
              key_file: key
              prefx: "x:"
              password_file: pw
            routes:
              - { match: /, upstream: "http://127.0.0.1:9000" }
            """, dir: dir)
            Issue.record("expected errors")
        } catch {
            let text = error.errors.map(\.description).joined(separator: "\n")
            #expect(text.contains("bearerd.yaml:2: shared_cache.url: invalid port"), "\(text)")
            #expect(text.contains("bearerd.yaml:3: shared_cache.key_file:"), "\(text)")
            #expect(text.contains("bearerd.yaml:4: shared_cache.prefx: unknown key (did you mean 'prefix'?)"), "\(text)")
            #expect(!text.contains("hunter2"))
        }
        do {
            _ = try load("""
            shared_cache:
              prefix: "x:"
            routes:
              - { match: /, upstream: "http://127.0.0.1:9000" }
            """, dir: dir)
            Issue.record("expected errors")
        } catch {
            let text = error.errors.map(\.description).joined(separator: "\n")
            #expect(text.contains("bearerd.yaml:1: shared_cache.url: missing required key"), "\(text)")
            #expect(text.contains("bearerd.yaml:1: shared_cache.key_file: missing required key"), "\(text)")
        }
    }
}
