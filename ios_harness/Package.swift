// swift-tools-version:5.9
// The harness logic as a package (protocol types, the decode sweep, Core ML engine, metrics);
// the iOS app target lives in project.yml (XcodeGen) and only wires the app lifecycle to it.
import PackageDescription

let package = Package(
    name: "DecodebenchHarness",
    platforms: [.iOS(.v18), .macOS(.v15)],
    products: [
        .library(name: "HarnessKit", targets: ["HarnessKit"]),
    ],
    targets: [
        .target(name: "HarnessKit", path: "Sources/HarnessKit"),
        .testTarget(name: "HarnessKitTests", dependencies: ["HarnessKit"], path: "Tests/HarnessKitTests"),
    ]
)
