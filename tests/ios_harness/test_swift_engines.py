"""The harness's engines, as far as Linux can check them from the Swift source.

Core AI exists only in the iOS 27 SDK, so every use of it must sit inside an
`#if canImport(CoreAI)` branch: an older SDK then compiles the harness without it, and a coreai
job fails with a model_error saying why. The engine a job names must be one of the project's
model formats (decodebench.contracts.names.FormatName), each opening its own artifact name, and
every format must reach its engine; anything else is refused by name.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from decodebench.contracts.names import ARTIFACT_NAMES, FormatName
from decodebench.harness import HarnessJob
from tests.support.paths import ROOT

HARNESS = ROOT / "ios_harness"
KIT = HARNESS / "Sources" / "HarnessKit"
SWIFT_FILES = sorted(path for path in HARNESS.rglob("*.swift") if path.name != "Package.swift")
# Core AI's Swift API and the harness's own types built on it.
CORE_AI = re.compile(
    r"\bimport CoreAI\b|\b(?:AIModel|AIModelCache|InferenceFunction\w*|NDArray|"
    r"SpecializationOptions|ComputeUnitKind|CoreAIEngine|CoreAIArrays)\b"
)
DIRECTIVE = re.compile(r"^\s*#(if|elseif|else|endif)\b(.*)$")


def without_comments(source: bytes) -> str:
    """The source with every comment blanked (comments may name Core AI freely)."""
    import tree_sitter_swift
    from tree_sitter import Language, Parser

    tree = Parser(Language(tree_sitter_swift.language())).parse(source)
    text = bytearray(source)
    pending = [tree.root_node]
    while pending:
        node = pending.pop()
        if "comment" in node.type:
            for index in range(node.start_byte, node.end_byte):
                if text[index] != ord("\n"):
                    text[index] = ord(" ")
        pending.extend(node.children)
    return text.decode()


def branch_guard(condition: str) -> bool | None:
    """True: the branch has Core AI; False: it lacks it; None: it says nothing about it."""
    condition = condition.strip()
    if condition == "canImport(CoreAI)":
        return True
    if condition == "!canImport(CoreAI)":
        return False
    return None


def unguarded_uses(source: bytes) -> list[str]:
    """Every line that uses Core AI outside an `#if canImport(CoreAI)` branch."""
    stack: list[bool | None] = []
    problems = []
    for number, line in enumerate(without_comments(source).splitlines(), start=1):
        directive = DIRECTIVE.match(line)
        if directive:
            kind, condition = directive.groups()
            if kind == "if":
                stack.append(branch_guard(condition))
            elif not stack:
                problems.append(f"{number}: #{kind} without #if")
            elif kind == "endif":
                stack.pop()
            elif kind == "else":
                stack[-1] = None if stack[-1] is None else not stack[-1]
            else:
                stack[-1] = branch_guard(condition)
            continue
        guarded = any(entry is True for entry in stack)
        if CORE_AI.search(line) and not guarded:
            problems.append(f"{number}: {line.strip()}")
    if stack:
        problems.append("an #if is never closed")
    return problems


def function_source(path: Path, name: str) -> str:
    import tree_sitter_swift
    from tree_sitter import Language, Parser

    tree = Parser(Language(tree_sitter_swift.language())).parse(path.read_bytes())
    pending = [tree.root_node]
    while pending:
        node = pending.pop()
        named = node.child_by_field_name("name") if node.type == "function_declaration" else None
        if named is not None and named.text == name.encode():
            return (node.text or b"").decode()
        pending.extend(reversed(node.children))  # source order: the first of that name
    raise AssertionError(f"{path.name} has no func {name}")


def enum_cases(name: str) -> list[str]:
    source = (KIT / "Engines.swift").read_text()
    match = re.search(rf"public enum {name}: String, [^{{]*\{{\n\s*case ([^\n]+)\n", source)
    assert match, f"no enum {name}"
    return [case.strip().strip("`") for case in match.group(1).split(",")]


def test_the_core_ai_engine_has_its_own_file() -> None:
    assert (KIT / "CoreAIEngine.swift").exists() and (KIT / "CoreMLEngine.swift").exists()
    assert "protocol StepEngine" in (KIT / "DecodeSweep.swift").read_text()


@pytest.mark.parametrize("path", SWIFT_FILES, ids=lambda path: path.name)
def test_core_ai_is_used_only_behind_can_import(path: Path) -> None:
    assert unguarded_uses(path.read_bytes()) == []


def test_the_core_ai_engine_file_is_guarded_whole() -> None:
    lines = without_comments((KIT / "CoreAIEngine.swift").read_bytes()).split()
    assert lines[:2] == ["#if", "canImport(CoreAI)"] and lines[-1] == "#endif"


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("import CoreAI\n", "1: import CoreAI"),
        ("#if canImport(CoreAI)\nlet a = 1\n#else\nvar x: NDArray\n#endif\n", "4: var x"),
        ("#if os(iOS)\nlet m = AIModelCache.default\n#endif\n", "2: let m"),
        ("#if canImport(CoreAI)\nimport CoreAI\n", "never closed"),
        ("#if !canImport(CoreAI)\nlet f: InferenceFunction\n#endif\n", "2: let f"),
    ],
)
def test_the_guard_check_catches_core_ai_outside_its_branch(source: str, problem: str) -> None:
    assert any(problem in found for found in unguarded_uses(source.encode()))


@pytest.mark.parametrize(
    "source",
    [
        "#if canImport(CoreAI)\nimport CoreAI\n#if os(iOS)\nlet a: NDArray\n#endif\n#endif\n",
        "#if !canImport(CoreAI)\nlet a = 1\n#else\nlet m: AIModel\n#endif\n",
        "// CoreAIEngine.swift holds the NDArray code\nlet a = 1\n",
    ],
)
def test_the_guard_check_accepts_core_ai_inside_its_branch(source: str) -> None:
    assert unguarded_uses(source.encode()) == []


def test_removing_the_guard_is_caught() -> None:
    source = (KIT / "CoreAIEngine.swift").read_text()
    broken = source.replace("#if canImport(CoreAI)\n", "", 1).replace("\n#endif\n", "\n", 1)
    assert broken != source
    assert unguarded_uses(broken.encode()) != []


def test_without_core_ai_a_coreai_job_fails_with_a_model_error() -> None:
    body = function_source(KIT / "Harness.swift", "measureCoreAI")
    fallback = body[body.index("#else") : body.index("#endif")]
    assert 'throw HarnessError.model("engine coreai' in fallback
    available = body[: body.index("#else")]
    assert "#available(iOS 27.0" in available and "needs iOS 27" in available


def test_every_model_format_is_an_engine_with_its_artifact() -> None:
    assert set(enum_cases("EngineKind")) == {member.value for member in FormatName}
    source = (KIT / "Engines.swift").read_text()
    for member in FormatName:
        suffix = Path(ARTIFACT_NAMES[member]).suffix
        assert f'case .{member.value}: return "{suffix}"' in source, member


def test_the_harness_dispatches_every_engine_and_nothing_else() -> None:
    body = function_source(KIT / "Harness.swift", "measure")
    assert "switch try EngineKind.named(job.engine)" in body
    cases = re.findall(r"case \.(\w+):", body)
    assert sorted(cases) == sorted(enum_cases("EngineKind"))
    assert "default:" not in body  # the switch stays exhaustive: a new engine must be wired


def test_an_unknown_engine_is_refused_by_name() -> None:
    named = function_source(KIT / "Engines.swift", "named")
    assert "guard let kind = EngineKind(rawValue: name)" in named
    assert 'throw HarnessError.badJob("job.json asks for engine \\(name);' in named
    assert "engineProblem(job)" in function_source(KIT / "DecodeSweep.swift", "jobProblem")
    # An absent engine is coreml on both sides.
    assert "name ?? EngineKind.coreml.rawValue" in named
    assert HarnessJob.model_fields["engine"].default == FormatName.coreml.value


def test_every_compute_unit_preference_maps_to_specialization_options() -> None:
    assert enum_cases("ComputeUnits") == ["default", "neural_engine", "gpu", "cpu"]
    body = function_source(KIT / "CoreAIEngine.swift", "specialization")
    assert sorted(re.findall(r"case \.(\w+):", body)) == sorted(enum_cases("ComputeUnits"))
    assert "preferredComputeUnitKind: .neuralEngine" in body and "return .cpuOnly" in body
