// swift-tools-version:6.0
import PackageDescription

/// Module split (shared/DESIGN.md §2): pure cores (BearerdHTTP, BearerdOAuth, BearerdProxyCore)
/// import neither Foundation, Dispatch nor a C module (BearerdProxyCore imports only the other two); engines and the Dispatch shell live in BearerdIO;
/// configuration, routing and the request pipeline in BearerdProxy; the command line in bearerd.
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
                "BearerdHTTP", "BearerdOAuth", "BearerdProxyCore", "BearerdConfig", "BearerdTLS", "BearerdIO",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: shellSettings
        ),
        .target(
            name: "BearerdService",
            dependencies: [
                "BearerdHTTP", "BearerdOAuth", "BearerdProxyCore", "BearerdConfig", "BearerdSessions", "BearerdIO",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: shellSettings
        ),
        .target(
            name: "BearerdTLS",
            dependencies: ["COpenSSL", "CBearerdShim"],
            swiftSettings: shellSettings
        ),
        .target(
            name: "BearerdIO",
            dependencies: [
                "BearerdHTTP", "BearerdTLS", "COpenSSL", "CNghttp2", "CBearerdShim",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: shellSettings
        ),
        .target(
            name: "BearerdProxy",
            dependencies: [
                "BearerdHTTP", "BearerdOAuth", "BearerdProxyCore", "BearerdConfig", "BearerdSessions", "BearerdService", "BearerdTLS", "BearerdIO",
                .product(name: "Yams", package: "Yams"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: shellSettings
        ),
        .executableTarget(
            name: "bearerd",
            dependencies: [
                "BearerdProxy",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: shellSettings
        ),
        .target(
            name: "BearerdTestSupport",
            dependencies: ["BearerdIO", "BearerdTLS", "COpenSSL", "CBearerdShim", .product(name: "Logging", package: "swift-log")],
            swiftSettings: shellSettings
        ),
        .testTarget(name: "BearerdHTTPTests", dependencies: ["BearerdHTTP"]),
        .testTarget(name: "BearerdOAuthTests", dependencies: ["BearerdOAuth"]),
        .testTarget(name: "BearerdProxyCoreTests", dependencies: ["BearerdProxyCore", "BearerdHTTP", "BearerdOAuth"]),
        .testTarget(name: "BearerdTLSTests", dependencies: ["BearerdTLS", "BearerdTestSupport"], swiftSettings: shellSettings),
        .testTarget(name: "BearerdIOTests", dependencies: ["BearerdIO", "BearerdTestSupport"], swiftSettings: shellSettings),
        .testTarget(name: "BearerdProxyTests", dependencies: ["BearerdProxy", "BearerdService", "BearerdSessions", "BearerdConfig", "BearerdProxyCore", "BearerdTLS", "BearerdTestSupport"], swiftSettings: shellSettings),
        .testTarget(
            name: "EndToEndTests",
            dependencies: ["bearerd", "BearerdProxy", "BearerdService", "BearerdSessions", "BearerdConfig", "BearerdProxyCore", "BearerdTLS", "BearerdIO", "BearerdHTTP", "BearerdOAuth", "BearerdTestSupport"],
            swiftSettings: shellSettings
        ),
    ]
)
