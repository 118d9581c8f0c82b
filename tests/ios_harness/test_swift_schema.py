"""The Swift harness's Codable types agree with the Python schema (generated from pydantic).

ios_harness cannot be compiled here, so its JSON contract is checked from the source: every
`CodingKeys` raw value, optionality and type of the structs it writes (RunResult, PromptResult,
DoneMarker) and reads (HarnessJob with its `variant` and `protocol_version`, HarnessPrompt,
VariantSpec), the cases of every enum both sides share, and the protocol constants.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel

from decodebench import harness
from decodebench.contracts import domain, results
from tests.support.paths import ROOT

SWIFT = ROOT / "ios_harness" / "Sources" / "HarnessKit" / "Protocol.swift"
STRUCT = re.compile(r"public struct (\w+): Codable, Sendable \{(.*?)\n\}", re.S)
PROPERTY = re.compile(r"^\s*public (?:let|var) (\w+): ([\w\[\]?]+)", re.M)
CODING_KEYS = re.compile(r"enum CodingKeys: String, CodingKey \{(.*?)\}", re.S)
CASE = re.compile(r"case (\w+)(?: = \"([^\"]+)\")?")
JSON_TYPES = {"Int": "integer", "Double": "number", "String": "string", "Bool": "boolean"}

WRITTEN = {
    "RunResult": results.RunResult,
    "PromptResult": results.PromptResult,
    "DoneMarker": harness.DoneMarker,
}
READ = {
    "HarnessJob": harness.HarnessJob,
    "HarnessPrompt": harness.HarnessPrompt,
    "VariantSpec": domain.VariantSpec,
}
ENUMS = {
    "ThermalState": results.ThermalState,
    "FailureReason": harness.FailureReason,
    "KVCache": domain.KVCache,
    "Attention": domain.Attention,
}
# Keys the harness must read: without them it could not check the job or pick the KV layout.
MUST_READ = {
    "HarnessJob": {"protocol_version", "variant", "warmup_steps", "context_tokens"},
    "VariantSpec": {"kv"},
}
# Optional keys the harness reads before decodebench/harness.py writes them (the Core AI
# engine's compute-unit preference); they must be optional in Swift, and once the Python schema
# has them they are checked like every other key.
READ_AHEAD = {"HarnessJob": {"compute_units"}}
CONSTANTS = {
    "version": harness.HARNESS_PROTOCOL_VERSION,
    "defaultThermalWaitS": harness.DEFAULT_THERMAL_WAIT_S,
    "maxThermalWaitS": harness.MAX_THERMAL_WAIT_S,
    "runIdEnvironment": harness.RUN_ID_ENVIRONMENT,
}


@dataclass(frozen=True)
class SwiftField:
    key: str
    swift_type: str

    @property
    def optional(self) -> bool:
        return self.swift_type.endswith("?")

    @property
    def base_type(self) -> str:
        return self.swift_type.rstrip("?")


def swift_structs(source: str) -> dict[str, dict[str, SwiftField]]:
    structs = {}
    for name, body in STRUCT.findall(source):
        properties = dict(PROPERTY.findall(body))
        keys_block = CODING_KEYS.search(body)
        assert keys_block, f"{name} has no explicit CodingKeys"
        keys = {case: raw or case for case, raw in CASE.findall(keys_block.group(1))}
        assert set(keys) == set(properties), f"{name}: CodingKeys and properties differ"
        structs[name] = {
            keys[prop]: SwiftField(keys[prop], kind) for prop, kind in properties.items()
        }
    return structs


def swift_enum_cases(source: str, name: str) -> set[str]:
    match = re.search(
        rf"public enum {name}: String, Codable, Sendable \{{\n\s*case ([\w, ]+)\n", source
    )
    assert match, f"no enum {name}"
    return {case.strip() for case in match.group(1).split(",")}


def schema_types(prop: dict[str, Any]) -> tuple[set[str], bool, dict[str, Any] | None]:
    """(JSON types, nullable, items schema) of one property of a pydantic JSON schema."""
    options = prop.get("anyOf", [prop])
    types, nullable, items = set(), False, None
    for option in options:
        if option.get("type") == "null":
            nullable = True
        elif "$ref" in option:
            types.add(option["$ref"].rsplit("/", 1)[-1])
        else:
            types.add(option["type"])
            items = option.get("items", items)
    return types, nullable, items


def type_problems(struct: str, field: SwiftField, prop: dict[str, Any]) -> list[str]:
    types, nullable, items = schema_types(prop)
    base = field.base_type
    if base.startswith("["):
        inner = base.strip("[]")
        if types != {"array"} or items is None:
            return [f"{struct}.{field.key}: Swift array, schema {types}"]
        inner_types = {items["$ref"].rsplit("/", 1)[-1]} if "$ref" in items else {items["type"]}
        wanted = {JSON_TYPES.get(inner, inner)}
        return (
            []
            if inner_types == wanted
            else [f"{struct}.{field.key}: items {inner_types} vs {wanted}"]
        )
    wanted = JSON_TYPES.get(base, base)
    if base == "Int" and types == {"number"}:
        return [f"{struct}.{field.key}: Swift Int, schema number"]
    if wanted not in types and not (base == "Double" and types == {"integer"}):
        return [f"{struct}.{field.key}: Swift {base}, schema {types}"]
    if not field.optional and nullable:
        return [f"{struct}.{field.key}: schema allows null, Swift does not"]
    return []


def contract_problems(source: str) -> list[str]:
    structs = swift_structs(source)
    problems: list[str] = []
    for name, model in {**WRITTEN, **READ}.items():
        schema = model.model_json_schema()
        properties, required = schema["properties"], set(schema.get("required", []))
        fields = structs.get(name)
        if fields is None:
            problems.append(f"Swift has no struct {name}")
            continue
        if name in WRITTEN:
            if set(fields) != set(properties):
                problems.append(
                    f"{name}: Swift keys {sorted(set(fields) ^ set(properties))} differ"
                )
            for key in required & set(fields):
                if fields[key].optional:
                    problems.append(f"{name}.{key}: required by the schema, optional in Swift")
        else:
            ahead = READ_AHEAD.get(name, set()) - set(properties)
            for key in ahead & set(fields):
                if not fields[key].optional:
                    problems.append(
                        f"{name}.{key}: read ahead of the agent, so it must be optional"
                    )
            extra = set(fields) - set(properties) - ahead
            if extra:
                problems.append(f"{name}: Swift reads keys the agent never writes: {sorted(extra)}")
            unread = MUST_READ.get(name, set()) - set(fields)
            if unread:
                problems.append(f"{name}: Swift does not read {sorted(unread)}")
        for key in set(fields) & set(properties):
            problems += type_problems(name, fields[key], properties[key])
    for name, enum in ENUMS.items():
        cases = {member.value for member in enum}
        if swift_enum_cases(source, name) != cases:
            problems.append(f"{name} cases differ from {sorted(cases)}")
    problems += constant_problems(source)
    return problems


def constant_problems(source: str) -> list[str]:
    block = re.search(r"public enum HarnessProtocol \{(.*?)\n\}", source, re.S)
    if block is None:
        return ["Swift has no enum HarnessProtocol"]
    values = dict(re.findall(r"public static let (\w+) = (.+)", block.group(1)))
    problems = []
    for name, expected in CONSTANTS.items():
        found = values.get(name, "").strip()
        literal = f'"{expected}"' if isinstance(expected, str) else None
        if found != literal and not (literal is None and found and float(found) == expected):
            problems.append(
                f"HarnessProtocol.{name} is {found or 'missing'}, Python says {expected}"
            )
    return problems


def test_the_swift_codable_types_match_the_json_schema() -> None:
    assert contract_problems(SWIFT.read_text()) == []


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (('case ttftMs = "ttft_ms"', 'case ttftMs = "ttftMs"'), "PromptResult: Swift keys"),
        (
            ("public var peakMemoryBytes: Int", "public var peakMemoryBytes: Int?"),
            "peak_memory_bytes: required",
        ),
        (
            ("public var decodeTokS: Double", "public var decodeTokS: String"),
            "decode_tok_s: Swift String",
        ),
        (
            (
                'case runId = "run_id"\n        case model',
                'case runId = "run_identifier"\n        case model',
            ),
            "HarnessJob",
        ),
        (("case nominal, fair,", "case nominal, warm,"), "ThermalState cases differ"),
        (("case state, input", "case state, host"), "KVCache cases differ"),
        (("public let kv: KVCache?", "public let kv: String?"), "VariantSpec.kv: Swift String"),
        (
            (
                ("    public let variant: VariantSpec?\n", ""),
                ("        case variant\n", ""),
            ),
            "does not read ['variant']",
        ),
        (
            (
                ('case protocolVersion = "protocol_version"\n        case runId', "case runId"),
                (
                    "    public let protocolVersion: Int\n    public let runId",
                    "    public let runId",
                ),
            ),
            "does not read ['protocol_version']",
        ),
        (("case interrupted, missing_job", "case interrupt, missing_job"), "FailureReason"),
        (("public static let version = 1", "public static let version = 2"), "version is 2"),
        (("public var reason: FailureReason?", "public var reason: String?"), "reason: Swift"),
        (
            ("public let computeUnits: String?", "public let computeUnits: String"),
            "compute_units: read ahead of the agent, so it must be optional",
        ),
        (
            (
                (
                    "    public let engine: String?\n",
                    "    public let engine: String?\n    public let gpuName: String?\n",
                ),
                (
                    "        case engine\n",
                    '        case engine\n        case gpuName = "gpu_name"\n',
                ),
            ),
            "reads keys the agent never writes: ['gpu_name']",
        ),
    ],
)
def test_the_check_catches_a_drifted_swift_type(edit: tuple[Any, ...], problem: str) -> None:
    edits = edit if isinstance(edit[0], tuple) else (edit,)
    drifted = SWIFT.read_text()
    for old, new in edits:
        assert old in drifted
        drifted = drifted.replace(old, new, 1)

    assert any(problem in message for message in contract_problems(drifted))


def test_every_checked_model_is_a_pydantic_model() -> None:
    assert all(issubclass(model, BaseModel) for model in {**WRITTEN, **READ}.values())
