// swift-tools-version:6.0
import PackageDescription

/// Module split (docs/architecture.md §2). Pure cores import neither Foundation, Dispatch nor a C
/// module: BearerdHTTP, BearerdOAuth, BearerdProxyCore (which imports only the other two).
/// BearerdTLS: the OpenSSL engine; BearerdIO: Dispatch loops and sockets; BearerdConfig: the YAML
/// contract (no I/O module); BearerdSessions: session drivers, token endpoint client, state store;
/// BearerdService: admin endpoints, logging, systemd; BearerdProxy: connections, pools, the
/// exchange driver, runtime and server; bearerd: the command line. `.ci/run` checks the purity rules.
let shellSettings: [SwiftSetting] = [.swiftLanguageMode(.v5)]

let package = Package(
    name: "bearerd",
    platforms: [.macOS(.v13)],
    products: [
        .executable(name: "bearerd", targets: ["bearerd"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/jpsim/Yams", from: "6.0.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.6.0"),
    ],
    targets: [
        .systemLibrary(
            name: "COpenSSL",
            pkgConfig: "openssl",
            providers: [.apt(["libssl-dev"])]
        ),
        .systemLibrary(
            name: "CNghttp2",
            pkgConfig: "libnghttp2",
            providers: [.apt(["libnghttp2-dev"])]
        ),
        .target(
            name: "CBearerdShim",
            dependencies: ["COpenSSL", "CNghttp2"]
        ),
        .target(name: "BearerdHTTP"),
        .target(name: "BearerdOAuth"),
        .target(name: "BearerdProxyCore", dependencies: ["BearerdHTTP", "BearerdOAuth"]),
        .target(
            name: "BearerdConfig",
            dependencies: [
                "BearerdHTTP", "BearerdOAuth", "BearerdProxyCore",
                .product(name: "Yams", package: "Yams"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: shellSettings
        ),
        .target(
            name: "BearerdSessions",
            dependencies: [
                "BearerdHTTP", "BearerdOAuth", "BearerdConfig", "BearerdTLS", "BearerdIO", "BearerdProxyCore",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: shellSettings
        ),
        .target(
            name: "BearerdService",
            dependencies: [
                "BearerdHTTP", "BearerdOAuth", "BearerdProxyCore", "BearerdConfig", "BearerdSessions", "BearerdIO", "BearerdTLS",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: shellSettings
        ),
        .target(
            name: "BearerdHTTP2",
            dependencies: ["BearerdHTTP", "CNghttp2"],
            swiftSettings: shellSettings
        ),
        .target(
            name: "BearerdTLS",
            dependencies: ["COpenSSL", "CBearerdShim"],
            swiftSettings: shellSettings
        ),
        .target(
            name: "BearerdIO",
            dependencies: ["BearerdTLS", "CBearerdShim"],
            swiftSettings: shellSettings
        ),
        .target(
            name: "BearerdProxy",
            dependencies: [
                "BearerdHTTP", "BearerdHTTP2", "BearerdOAuth", "BearerdProxyCore", "BearerdConfig", "BearerdSessions", "BearerdService", "BearerdTLS", "BearerdIO",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: shellSettings
        ),
        .executableTarget(
            name: "bearerd",
            dependencies: [
                // Every module the command line imports, declared (an undeclared one left the
                // executable's objects stale after a change to BearerdOAuth's types).
                "BearerdProxy", "BearerdIO", "BearerdOAuth", "BearerdProxyCore", "BearerdConfig", "BearerdSessions", "BearerdService",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: shellSettings
        ),
        .target(
            name: "BearerdTestSupport",
            dependencies: ["BearerdIO", "BearerdHTTP", "BearerdTLS", "COpenSSL", "CBearerdShim", .product(name: "Logging", package: "swift-log")],
            swiftSettings: shellSettings
        ),
        .testTarget(name: "BearerdHTTPTests", dependencies: ["BearerdHTTP"]),
        .testTarget(name: "BearerdOAuthTests", dependencies: ["BearerdOAuth"]),
        // Router, allowlist and browser-guard tests build their rules from BearerdConfig's types.
        .testTarget(name: "BearerdProxyCoreTests", dependencies: ["BearerdProxyCore", "BearerdHTTP", "BearerdOAuth", "BearerdConfig"]),
        .testTarget(name: "BearerdConfigTests", dependencies: ["BearerdConfig", "BearerdProxyCore", "BearerdHTTP", "BearerdOAuth", "BearerdSessions", "BearerdTLS", "BearerdIO"], swiftSettings: shellSettings),
        .testTarget(name: "BearerdSessionsTests", dependencies: ["BearerdSessions", "BearerdService", "BearerdConfig", "BearerdProxyCore", "BearerdHTTP", "BearerdOAuth", "BearerdTLS", "BearerdIO", "BearerdTestSupport", .product(name: "Logging", package: "swift-log")], swiftSettings: shellSettings),
        .testTarget(name: "BearerdServiceTests", dependencies: ["BearerdService", "BearerdOAuth", "BearerdSessions", "BearerdConfig", "BearerdProxyCore", "BearerdIO", "BearerdTestSupport"], swiftSettings: shellSettings),
        .testTarget(name: "BearerdHTTP2Tests", dependencies: ["BearerdHTTP2", "BearerdHTTP"], swiftSettings: shellSettings),
        .testTarget(name: "BearerdTLSTests", dependencies: ["BearerdTLS", "BearerdTestSupport"], swiftSettings: shellSettings),
        .testTarget(name: "BearerdIOTests", dependencies: ["BearerdIO", "BearerdTestSupport"], swiftSettings: shellSettings),
        .testTarget(name: "BearerdProxyTests", dependencies: ["BearerdProxy", "BearerdService", "BearerdSessions", "BearerdConfig", "BearerdProxyCore", "BearerdTLS", "BearerdTestSupport"], swiftSettings: shellSettings),
        .testTarget(
            name: "EndToEndTests",
            dependencies: ["bearerd", "BearerdProxy", "BearerdService", "BearerdSessions", "BearerdConfig", "BearerdProxyCore", "BearerdTLS", "BearerdIO", "BearerdHTTP", "BearerdHTTP2", "BearerdOAuth", "BearerdTestSupport"],
            swiftSettings: shellSettings
        ),
    ]
)
