import Foundation
import Testing
import BearerdTestSupport

/// deploy/kubernetes validated offline against the Kubernetes schemas (kubernetes-validate, from
/// PyPI, carries them): every resource of every manifest, strictly (unknown fields are errors).
/// The manifests name the image `build-image.sh` builds, at bearerd's own version.
@Suite("deploy/kubernetes schemas")
struct KubernetesManifestTests {
    static let root = DeployTests.root
    static var validator: String {
        URL(fileURLWithPath: AuthServerFixture.python).deletingLastPathComponent().appendingPathComponent("kubernetes-validate").path
    }
    static var haveValidator: Bool {
        FileManager.default.isExecutableFile(atPath: validator) || ProcessInfo.processInfo.environment["CI"] != nil
    }

    static func manifests() throws -> [String] {
        let dir = root.appendingPathComponent("deploy/kubernetes")
        return try FileManager.default.contentsOfDirectory(atPath: dir.path)
            .filter { $0.hasSuffix(".yaml") }.sorted().map { "deploy/kubernetes/" + $0 }
    }

    @Test(.enabled(if: haveValidator))
    func everyManifestIsValidAgainstTheKubernetesSchemas() throws {
        let files = try Self.manifests()
        #expect(files.count >= 2, "\(files)")
        for file in files {
            let r = try DeployTests.run(Self.validator, ["--strict", "--kubernetes-version", "1.33", file], cwd: Self.root)
            #expect(r.status == 0, "\(file):\n\(r.stdout)\(r.stderr)")
            #expect(r.stdout.contains("passed") || r.stderr.contains("passed"), "\(file): nothing validated:\n\(r.stdout)\(r.stderr)")
            #expect(!(r.stdout + r.stderr).contains("ERROR"), "\(file):\n\(r.stdout)\(r.stderr)")
        }
    }

    @Test func manifestsNameTheBuiltImageAtThisVersion() throws {
        let version = try CommandLineTests.run(["--version"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        for file in try Self.manifests() {
            let text = try DeployTests.read(file)
            let images = text.split(separator: "\n").compactMap { line -> String? in
                let t = line.trimmingCharacters(in: .whitespaces)
                guard t.hasPrefix("image:") else { return nil }
                return t.dropFirst("image:".count).trimmingCharacters(in: .whitespaces)
            }.filter { $0.contains("/bearerd:") }
            #expect(!images.isEmpty, "\(file) runs no bearerd image")
            for image in images {
                #expect(image.hasSuffix("/bearerd:\(version)"), "\(file): \(image) is not bearerd:\(version), the image build-image.sh makes")
            }
        }
    }
}
