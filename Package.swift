// swift-tools-version: 6.2
// Swift 6.2 or later (6.2 brought strict memory safety), on Linux: built and tested with Swift 6.3.1 on
// Debian 12 (x86_64), with libuv, OpenSSL 3, wslay and http-parser from Debian (scripts/setup). macOS is
// not supported: the sources call the C library through Glibc only.
import PackageDescription

/// Targets that must contain no unmarked unsafe code: everything but the libuv transport.
let safeSettings: [SwiftSetting] = [.strictMemorySafety()]

let package = Package(
    name: "Switchboard",
    products: [
        .library(name: "SwitchboardCodec", targets: ["SwitchboardCodec"]),
        .library(name: "SwitchboardWire", targets: ["SwitchboardWire"]),
        .library(name: "SwitchboardTransport", targets: ["SwitchboardTransport"]),
        .library(name: "SwitchboardPluginAPI", targets: ["SwitchboardPluginAPI"]),
        .library(name: "SwitchboardServer", targets: ["SwitchboardServer"]),
        .library(name: "SwitchboardServerCombine", targets: ["SwitchboardServerCombine"]),
        .library(name: "SwitchboardClient", targets: ["SwitchboardClient"]),
        .library(name: "SwitchboardPlugins", targets: ["SwitchboardPlugins"]),
        .library(name: "SwitchboardDemo", targets: ["SwitchboardDemo"]),
        .library(name: "SwitchboardCluster", targets: ["SwitchboardCluster"]),
        .library(name: "SwitchboardTesting", targets: ["SwitchboardTesting"]),
        .executable(name: "switchboard", targets: ["switchboard"]),
        .executable(name: "broker-example", targets: ["BrokerExample"]),
        .executable(name: "server-example", targets: ["ServerExample"]),
        .executable(name: "client-example", targets: ["ClientExample"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/x-sheep/swift-property-based.git", from: "2.0.1"),
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift.git", from: "0.2.0"),
        .package(url: "https://github.com/OpenCombine/OpenCombine.git", from: "0.14.0"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
    ],
    targets: [
        .systemLibrary(
            name: "CLibUV",
            pkgConfig: "libuv",
            providers: [.apt(["libuv1-dev"])]
        ),
        .target(name: "SwitchboardCodec", swiftSettings: safeSettings),
        .target(name: "SwitchboardWire", dependencies: ["SwitchboardCodec"], swiftSettings: safeSettings),
        .systemLibrary(
            name: "COpenSSL",
            pkgConfig: "openssl",
            providers: [.apt(["libssl-dev"])]
        ),
        .systemLibrary(name: "CWslay", providers: [.apt(["libwslay-dev"])]),  // Debian ships no .pc file
        .systemLibrary(name: "CHTTPParser", providers: [.apt(["libhttp-parser-dev"])]),  // nor here
        .target(name: "SwitchboardTransport", dependencies: ["CLibUV", "COpenSSL", "CWslay", "CHTTPParser"]),
        .target(
            name: "SwitchboardConsole",
            exclude: ["js/test", "js/package.json", "js/README.md", "js/tcp.js"],
            resources: [.embedInCode("js/codec.js"), .embedInCode("js/client.js"), .embedInCode("console/index.html")],
            swiftSettings: safeSettings
        ),
        .target(
            name: "SwitchboardPluginAPI",
            dependencies: ["SwitchboardCodec", "SwitchboardWire", "SwitchboardTransport"],
            swiftSettings: safeSettings
        ),
        .target(
            name: "SwitchboardServer",
            dependencies: [
                "SwitchboardCodec", "SwitchboardWire", "SwitchboardTransport", "SwitchboardConsole", "SwitchboardCluster",
                "SwitchboardPluginAPI",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            swiftSettings: safeSettings
        ),
        .target(
            name: "SwitchboardServerCombine",
            dependencies: [
                "SwitchboardCodec", "SwitchboardTransport", "SwitchboardServer",
                .product(name: "OpenCombine", package: "OpenCombine", condition: .when(platforms: [.linux, .windows, .android])),
            ],
            swiftSettings: safeSettings
        ),
        .target(
            name: "SwitchboardPlugins",
            dependencies: [
                "SwitchboardCodec", "SwitchboardPluginAPI", "SwitchboardTransport",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: safeSettings
        ),
        .target(
            name: "SwitchboardDemo",
            dependencies: ["SwitchboardCodec", "SwitchboardWire", "SwitchboardTransport", "SwitchboardServer"],
            swiftSettings: safeSettings
        ),
        .target(
            name: "SwitchboardCluster",
            dependencies: ["SwitchboardCodec", "SwitchboardWire", "SwitchboardTransport", .product(name: "Logging", package: "swift-log")],
            swiftSettings: safeSettings
        ),
        .target(
            name: "SwitchboardClient",
            dependencies: [
                "SwitchboardCodec", "SwitchboardWire", "SwitchboardTransport",
                .product(name: "OpenCombine", package: "OpenCombine", condition: .when(platforms: [.linux, .windows, .android])),
            ],
            swiftSettings: safeSettings
        ),
        .target(
            name: "SwitchboardTesting",
            dependencies: [
                "SwitchboardCodec", "SwitchboardWire", "SwitchboardServer", "SwitchboardTransport", "SwitchboardPlugins",
                "SwitchboardPluginAPI", "SwitchboardDemo", .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "switchboard",
            dependencies: [
                "SwitchboardServer", "SwitchboardPlugins", "SwitchboardClient", "SwitchboardTransport", "SwitchboardWire", "SwitchboardCodec",
                "SwitchboardCluster", "SwitchboardDemo",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Histogram", package: "hdrhistogram-swift"),
                .product(name: "Logging", package: "swift-log"),
            ],
            exclude: ["commit.txt"],
            plugins: ["BuildInfo"]
        ),
        .plugin(name: "BuildInfo", capability: .buildTool()),
        .executableTarget(name: "BrokerExample", dependencies: ["SwitchboardClient"], path: "Examples/BrokerExample"),
        .executableTarget(name: "ServerExample", dependencies: ["SwitchboardServer"], path: "Examples/ServerExample"),
        .executableTarget(name: "ClientExample", dependencies: ["SwitchboardClient"], path: "Examples/ClientExample"),
        .testTarget(
            name: "SwitchboardCodecTests",
            dependencies: ["SwitchboardCodec", "SwitchboardTesting", .product(name: "PropertyBased", package: "swift-property-based")]
        ),
        .testTarget(name: "SwitchboardWireTests", dependencies: ["SwitchboardWire", "SwitchboardCodec"]),
        .testTarget(name: "SwitchboardTransportTests", dependencies: ["SwitchboardTransport", "SwitchboardTesting"]),
        .testTarget(
            name: "SwitchboardClientTests",
            dependencies: [
                "SwitchboardClient", "SwitchboardServer", "SwitchboardCodec", "SwitchboardWire", "SwitchboardTesting",
                "SwitchboardPlugins", "SwitchboardPluginAPI", "SwitchboardTransport", "SwitchboardDemo",
                .product(name: "OpenCombine", package: "OpenCombine", condition: .when(platforms: [.linux, .windows, .android])),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "SwitchboardClusterTests",
            dependencies: [
                "SwitchboardCluster", "SwitchboardTransport", "SwitchboardServer", "SwitchboardClient", "SwitchboardCodec",
                "SwitchboardTesting", "SwitchboardWire", "SwitchboardPlugins", "SwitchboardDemo", .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "SwitchboardServerTests",
            dependencies: [
                "SwitchboardServer", "SwitchboardPlugins", "SwitchboardPluginAPI", "SwitchboardWire", "SwitchboardCodec",
                "SwitchboardTesting", "SwitchboardCluster", "SwitchboardTransport", "SwitchboardDemo",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "SwitchboardServerCombineTests",
            dependencies: [
                "SwitchboardServerCombine", "SwitchboardServer", "SwitchboardCodec", "SwitchboardWire", "SwitchboardTesting",
                .product(name: "OpenCombine", package: "OpenCombine", condition: .when(platforms: [.linux, .windows, .android])),
            ]
        ),
        .testTarget(
            name: "SwitchboardPluginsTests",
            dependencies: [
                "SwitchboardPlugins", "SwitchboardPluginAPI", "SwitchboardServer", "SwitchboardCodec", "SwitchboardWire",
                "SwitchboardTesting", "SwitchboardTransport", "SwitchboardDemo", .product(name: "Logging", package: "swift-log"),
            ]
        ),
    ]
)
