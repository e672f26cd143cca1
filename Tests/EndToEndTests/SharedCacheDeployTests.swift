import Foundation
import Testing
import BearerdConfig

/// deploy/kubernetes/replicas-redis.yaml (docs/guides/replicas-redis.md): its embedded bearerd.yaml
/// is a valid configuration with shared_cache:, whose key and password files lie on the
/// mounted Secret (the schemas are checked by KubernetesManifestTests).
@Suite struct SharedCacheDeployTests {
    @Test func replicasExampleConfigIsValid() throws {
        let manifest = try DeployTests.read("deploy/kubernetes/replicas-redis.yaml")
        let lines = manifest.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        let start = try #require(lines.firstIndex { $0.trimmingCharacters(in: .whitespaces) == "bearerd.yaml: |" })
        var block: [String] = []
        for line in lines[(start + 1)...] {
            if !line.isEmpty && !line.hasPrefix("    ") { break }
            block.append(String(line.dropFirst(min(4, line.count))))
        }
        let config = try ConfigLoader.parse(yaml: block.joined(separator: "\n"), file: "replicas-redis.yaml", environment: [:], checkFiles: false)
        let shared = try #require(config.sharedCache)
        #expect(shared.endpoint == .tcp(host: "bearerd-redis", port: 6379, tls: false))
        #expect(manifest.contains("mountPath: \((shared.keyFile as NSString).deletingLastPathComponent)"))
        guard case .file(let pw)? = shared.password else { Issue.record("password_file expected"); return }
        #expect(manifest.contains("mountPath: \((pw as NSString).deletingLastPathComponent)"))
        #expect(manifest.contains("name: bearerd-redis") && manifest.contains("kind: Service"))
    }
}
