// swift-tools-version:5.9
// The harness logic as a package (protocol types, the decode sweep, the Core ML and Core AI
// engines, metrics); the iOS app target lives in project.yml (XcodeGen) and only wires the app
// lifecycle to it. Every file under Sources/HarnessKit is compiled; CoreAIEngine.swift is empty
// where the SDK has no Core AI (`#if canImport(CoreAI)`), so no manifest setting names it.
//
// Platforms are spelled as version strings: `.iOS(.v18)` / `.macOS(.v15)` exist only from
// PackageDescription 6.0, while the string form is valid for every tools version from 5.0 on.
// Tools 5.9 keeps the Swift 5 language mode, which Metrics.swift needs (`mach_task_self_` is a
// shared mutable C global that Swift 6 mode rejects). tests/ios_harness/test_swift_syntax.py
// checks these spellings against the declared tools version.
import PackageDescription

let package = Package(
    name: "DecodebenchHarness",
    platforms: [.iOS("18.0"), .macOS("15.0")],
    products: [
        .library(name: "HarnessKit", targets: ["HarnessKit"]),
    ],
    targets: [
        .target(name: "HarnessKit", path: "Sources/HarnessKit"),
        .testTarget(name: "HarnessKitTests", dependencies: ["HarnessKit"], path: "Tests/HarnessKitTests"),
    ]
)
