"""The Swift harness as far as Linux can check it: a real Swift grammar and its manifest.

No Swift compiler runs here, so every `.swift` file under `ios_harness/` is parsed with
tree-sitter's Swift grammar (a syntax error fails the test), and `Package.swift`'s platform
spellings are checked against its declared tools version (`.iOS(.v18)` only exists from
PackageDescription 6.0; the string form `.iOS("18.0")` from 5.0), including the Swift 5 language
mode the harness needs for `mach_task_self_`.
"""

from __future__ import annotations

import plistlib
import re
from pathlib import Path

import pytest

from decodebench.harness import HARNESS_PROTOCOL_VERSION
from tests.support.paths import ROOT

HARNESS = ROOT / "ios_harness"
SWIFT_FILES = sorted(HARNESS.rglob("*.swift"))

# The PackageDescription version that introduced each enum spelling (the rest are older than 5.0).
PLATFORM_SINCE = {
    "iOS": {
        "v13": (5, 1),
        "v14": (5, 3),
        "v15": (5, 5),
        "v16": (5, 7),
        "v17": (5, 9),
        "v18": (6, 0),
    },
    "macOS": {
        "v10_15": (5, 1),
        "v11": (5, 3),
        "v12": (5, 5),
        "v13": (5, 7),
        "v14": (5, 9),
        "v15": (6, 0),
    },
}
OLDEST = {"iOS": {f"v{n}" for n in range(8, 13)}, "macOS": {f"v10_{n}" for n in range(10, 15)}}
TOOLS = re.compile(r"\A// swift-tools-version: ?(\d+)\.(\d+)(?:\.\d+)?\n")
PLATFORM = re.compile(r"\.(iOS|macOS)\((?:\.(\w+)|\"([^\"]*)\")\)")
VERSION_STRING = re.compile(r"^\d+\.\d+(\.\d+)?$")


def syntax_errors(source: bytes) -> list[str]:
    """Every ERROR or MISSING node of the Swift parse tree, with its line and column."""
    import tree_sitter_swift
    from tree_sitter import Language, Parser

    tree = Parser(Language(tree_sitter_swift.language())).parse(source)
    errors: list[str] = []
    pending = [tree.root_node]
    while pending:
        node = pending.pop()
        if node.is_error or node.is_missing:
            line, column = node.start_point
            text = (node.text or b"")[:40].decode(errors="replace")
            kind = "missing " + node.type if node.is_missing else "unexpected"
            errors.append(f"{line + 1}:{column + 1}: {kind} {text!r}")
        pending.extend(node.children)
    return sorted(errors)


def manifest_problems(manifest: str) -> list[str]:
    tools = TOOLS.match(manifest)
    if tools is None:
        return ["the first line does not declare // swift-tools-version:X.Y"]
    version = (int(tools.group(1)), int(tools.group(2)))
    manifest = re.sub(r"//[^\n]*", "", manifest)  # spellings in comments do not count
    problems = []
    platforms = PLATFORM.findall(manifest)
    if not platforms:
        problems.append("no .iOS(...) platform declared")
    for platform, spelling, string in platforms:
        if string:
            if not VERSION_STRING.match(string):
                problems.append(f'.{platform}("{string}") is not a version string')
            continue
        since = PLATFORM_SINCE[platform].get(spelling)
        if since is None and spelling not in OLDEST[platform]:
            problems.append(f".{platform}(.{spelling}) is not a PackageDescription spelling")
        elif since is not None and version < since:
            problems.append(
                f".{platform}(.{spelling}) needs swift-tools-version {since[0]}.{since[1]}, "
                f"the manifest declares {version[0]}.{version[1]}"
            )
    if "swiftLanguageModes" in manifest and version < (6, 0):
        problems.append("swiftLanguageModes needs swift-tools-version 6.0")
    swift5 = re.search(
        r"swiftLanguage(?:Modes|Versions): \[\.v5\]|\.swiftLanguageMode\(\.v5\)", manifest
    )
    if version >= (6, 0) and swift5 is None:
        problems.append("tools 6.0 defaults to Swift 6 mode, which rejects mach_task_self_")
    return problems


def test_there_are_swift_files_to_check() -> None:
    names = {path.name for path in SWIFT_FILES}
    assert {"Package.swift", "CoreMLEngine.swift", "DecodebenchHarnessApp.swift"} <= names


@pytest.mark.parametrize("path", SWIFT_FILES, ids=lambda path: path.name)
def test_every_swift_file_parses_with_the_swift_grammar(path: Path) -> None:
    assert syntax_errors(path.read_bytes()) == []


@pytest.mark.parametrize(
    "broken",
    [
        "func step(token: Int { return token }",
        "let x = [1, 2\nstruct A {}",
        "if let value = optional { print(value) ",
        "public struct S: Codable { public let a: Int = }",
    ],
)
def test_a_syntax_error_is_caught(broken: str) -> None:
    assert syntax_errors(broken.encode()) != []


def test_a_broken_harness_file_is_caught() -> None:
    source = (HARNESS / "Sources" / "HarnessKit" / "DecodeSweep.swift").read_text()
    broken = source.replace("for position in 0..<steps {", "for position in 0..<steps", 1)
    assert broken != source
    assert syntax_errors(broken.encode()) != []


def test_the_manifest_platforms_exist_in_its_tools_version() -> None:
    assert manifest_problems((HARNESS / "Package.swift").read_text()) == []


@pytest.mark.parametrize(
    ("manifest", "problem"),
    [
        (
            "// swift-tools-version:5.9\nplatforms: [.iOS(.v18), .macOS(.v15)]",
            ".iOS(.v18) needs swift-tools-version 6.0, the manifest declares 5.9",
        ),
        ("// swift-tools-version:5.9\nplatforms: [.iOS(.v17)]", None),
        ("// swift-tools-version:6.0\nplatforms: [.iOS(.v18)]", "Swift 6 mode"),
        (
            "// swift-tools-version:6.0\nplatforms: [.iOS(.v18)],\nswiftLanguageModes: [.v5]",
            None,
        ),
        ('// swift-tools-version:5.9\nplatforms: [.iOS("18")]', "not a version string"),
        ("// swift-tools-version:5.9\nplatforms: [.iOS(.v19)]", "not a PackageDescription"),
        ('import PackageDescription\nplatforms: [.iOS("18.0")]', "swift-tools-version"),
    ],
)
def test_the_manifest_check_catches_wrong_spellings(manifest: str, problem: str | None) -> None:
    problems = manifest_problems(manifest)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in message for message in problems), problems


def test_the_app_agrees_with_the_package_and_the_protocol() -> None:
    manifest = (HARNESS / "Package.swift").read_text()
    project = (HARNESS / "project.yml").read_text()
    ios = re.search(r'\.iOS\("([\d.]+)"\)', manifest)
    assert ios is not None and f'iOS: "{ios.group(1)}"' in project
    info = plistlib.loads((HARNESS / "App" / "Info.plist").read_bytes())
    assert info["DecodebenchHarnessProtocol"] == HARNESS_PROTOCOL_VERSION
    export = plistlib.loads((HARNESS / "ExportOptions.plist").read_bytes())
    assert export["method"] == "debugging"  # "development" was renamed in Xcode 15.3
