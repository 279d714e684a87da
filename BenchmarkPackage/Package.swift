// swift-tools-version: 6.2
import PackageDescription

// Kept out of the main build: `swift run -c release --package-path BenchmarkPackage codec-benchmarks`.
let package = Package(
    name: "SwitchboardBenchmarks",
    // Named, so `package: "main"` holds whatever the clone's directory is called.
    dependencies: [.package(name: "main", path: "..")],
    targets: [
        .executableTarget(
            name: "codec-benchmarks",
            dependencies: [.product(name: "SwitchboardCodec", package: "main")],
            path: "Sources/CodecBenchmarks"
        ),
    ]
)
