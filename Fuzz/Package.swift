// swift-tools-version: 6.2
import PackageDescription

// libFuzzer targets, kept out of the main build: run them with `scripts/fuzz [SECONDS]` (see README.md).
// Each target is one file defining `LLVMFuzzerTestOneInput`, no main.swift: built with `--sanitize fuzzer`,
// SwiftPM compiles it -parse-as-library and libFuzzer's own main drives it.
/// What the targets that drive a whole server (through `EmbeddedServer`, with the plugins) need.
let wholeServer: [Target.Dependency] = [
    "FuzzSupport",
    .product(name: "SwitchboardTesting", package: "main"),
    .product(name: "SwitchboardServer", package: "main"),
    .product(name: "SwitchboardWire", package: "main"),
    .product(name: "SwitchboardCodec", package: "main"),
    .product(name: "SwitchboardPlugins", package: "main"),
    .product(name: "SwitchboardPluginAPI", package: "main"),
]

let package = Package(
    name: "SwitchboardFuzz",
    // Named, so `package: "main"` holds whatever the clone's directory is called.
    dependencies: [.package(name: "main", path: "..")],
    targets: [
        .target(name: "FuzzSupport"),
        .executableTarget(
            name: "fuzz-frame-decoder",
            dependencies: ["FuzzSupport", .product(name: "SwitchboardWire", package: "main")],
            path: "Sources/FuzzFrameDecoder"
        ),
        .executableTarget(
            name: "fuzz-line-decoder",
            dependencies: ["FuzzSupport", .product(name: "SwitchboardWire", package: "main")],
            path: "Sources/FuzzLineDecoder"
        ),
        .executableTarget(
            name: "fuzz-standard-codec",
            dependencies: ["FuzzSupport", .product(name: "SwitchboardCodec", package: "main")],
            path: "Sources/FuzzStandardCodec"
        ),
        .executableTarget(
            name: "fuzz-json-text",
            dependencies: ["FuzzSupport", .product(name: "SwitchboardCodec", package: "main")],
            path: "Sources/FuzzJSONText"
        ),
        .executableTarget(
            name: "fuzz-nats-parser",
            dependencies: ["FuzzSupport", .product(name: "SwitchboardCluster", package: "main")],
            path: "Sources/FuzzNATSParser"
        ),
        .executableTarget(
            name: "fuzz-connection",
            dependencies: wholeServer,
            path: "Sources/FuzzConnection"
        ),
        .executableTarget(
            name: "fuzz-channels",
            dependencies: wholeServer,
            path: "Sources/FuzzChannels"
        ),
        .executableTarget(
            name: "fuzz-web",
            dependencies: [
                "FuzzSupport",
                .product(name: "SwitchboardTesting", package: "main"),
                .product(name: "SwitchboardServer", package: "main"),
                .product(name: "SwitchboardTransport", package: "main"),
            ],
            path: "Sources/FuzzWeb"
        ),
    ]
)
