"""The house's layers, held to the code: every import (those inside functions too) points down.

``docs/architecture.md`` draws the layers and says what each may import; this is its enforcement.
It reads the sources with ``ast``, so it needs neither torch, coremltools nor a database.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("decodebench", "server", "worker", "agent", "emulator")

# Which of the project's packages each may import besides itself (and the standard library and
# third parties). The roles never import each other; the emulated iPhone is a test double.
ALLOWED_PACKAGES = {
    "decodebench": set(),
    "server": {"decodebench"},
    "worker": {"decodebench"},
    "agent": {"decodebench"},
    "emulator": {"decodebench"},
}
# The agent's emulated driver is the one place a role starts the emulated iPhone.
EMULATOR_USERS = {"agent.drivers.emulated", "agent.drivers.faults_spec"}

# The library's floors, lowest first, by the name below ``decodebench.`` ("" is the package
# itself): a module may import from its own floor or from a lower one.
LIBRARY_FLOORS: list[set[str]] = [
    {"contracts"},
    {
        "_quiet",
        "archives",
        "artifacts",
        "broker",
        "calibration",
        "checkpoints",
        "client",
        "detokenize",
        "harness",
        "prompts",
        "stats",
        "timing",
        "toolchain",
    },
    # A model format (``formats/<name>/``) reads its packages into the graph the analyses
    # consume and runs the analyses on them: the two share a floor.
    {"analysis", "formats", "judging", "modeling"},
    {"building", "modelfiles"},
    # The doctor diagnoses and repairs packages a format built or a user uploaded; nothing that
    # builds imports it, so it stays out of the build fingerprint (decodebench/toolchain.py).
    {"doctor"},
    {"commands", "uploading"},
    {"cli", ""},
]

CONTRACTS_MAY_IMPORT = {"pydantic", "pydantic_core", "annotated_types", "typing_extensions"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, Path]:
    return {
        module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def imported_names(name: str, path: Path) -> set[str]:
    """Every dotted name an import statement of the module names, relative ones made absolute."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The project module an import names (the longest known prefix), or None for others."""
    parts = target.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = sources()
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for target in imported_names(name, path):
            resolved = resolve(target, modules)
            if resolved and resolved != name:
                edges[name].add(resolved)
    return edges


@pytest.fixture(scope="module")
def external() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for name, path in sources().items():
        found[name] = (
            {target.split(".")[0] for target in imported_names(name, path)} - set(PACKAGES) - {""}
        )
    return found


def test_roles_import_only_the_packages_below_them(graph: dict[str, set[str]]) -> None:
    wrong = [
        f"{source} -> {target}"
        for source, targets in graph.items()
        for target in targets
        if target.split(".")[0] != source.split(".")[0]
        and target.split(".")[0] not in ALLOWED_PACKAGES[source.split(".")[0]]
        and not (target.startswith("emulator") and source in EMULATOR_USERS)
    ]
    assert not wrong, "imports across roles that the layers forbid:\n" + "\n".join(sorted(wrong))


def test_contracts_import_nothing_heavier_than_pydantic(external: dict[str, set[str]]) -> None:
    allowed = set(sys.stdlib_module_names) | CONTRACTS_MAY_IMPORT
    wrong = {
        name: sorted(found - allowed)
        for name, found in external.items()
        if name.startswith("decodebench.contracts") and found - allowed
    }
    assert not wrong


def test_contracts_import_only_contracts(graph: dict[str, set[str]]) -> None:
    wrong = [
        f"{source} -> {target}"
        for source, targets in graph.items()
        if source.startswith("decodebench.contracts")
        for target in targets
        if not target.startswith("decodebench.contracts")
    ]
    assert not wrong


def floor_of(module: str) -> int | None:
    """The floor of a library module (None outside the library, or on no floor)."""
    parts = module.split(".")
    if parts[0] != "decodebench":
        return None
    below = parts[1:] or [""]
    for index, floor in enumerate(LIBRARY_FLOORS):
        if below[0] in floor:
            return index
    return None


def test_every_library_module_has_a_floor() -> None:
    homeless = [
        name for name in sources() if name.split(".")[0] == "decodebench" and floor_of(name) is None
    ]
    assert not homeless, f"modules on no floor of LIBRARY_FLOORS: {homeless}"


def test_no_library_import_runs_back_up(graph: dict[str, set[str]]) -> None:
    wrong = []
    for source, targets in graph.items():
        source_floor = floor_of(source)
        if source_floor is None:
            continue
        for target in targets:
            target_floor = floor_of(target)
            if target_floor is not None and target_floor > source_floor:
                wrong.append(f"{source} (floor {source_floor}) -> {target} (floor {target_floor})")
    assert not wrong, "imports that run back up:\n" + "\n".join(sorted(wrong))


def test_no_modules_import_each_other_in_a_circle(graph: dict[str, set[str]]) -> None:
    # Tarjan's strongly connected components over the module graph.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sources():
        if node not in index:
            visit(node)
    assert not circles, f"modules that import each other in a circle: {circles}"


# Each model format's SDK, and the one folder that may import it.
FORMAT_SDKS = {
    "coremltools": "decodebench.formats.coreml",
    "coreai": "decodebench.formats.coreai",
    "coreai_torch": "decodebench.formats.coreai",
    "coreai_opt": "decodebench.formats.coreai",
}


def test_only_a_formats_own_folder_imports_its_sdk(external: dict[str, set[str]]) -> None:
    wrong = [
        f"{name} imports {sdk}"
        for name, found in external.items()
        for sdk, home in FORMAT_SDKS.items()
        if sdk in found and name != home and not name.startswith(home + ".")
    ]
    assert not wrong, "an SDK imported outside its format's folder:\n" + "\n".join(sorted(wrong))


MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
# Modules and functions still over the limits, each to be split; the list only shrinks (a name
# that is back under its limit fails the test until it is taken off).
OVER_THE_LIMIT: set[str] = set()


def oversized() -> set[str]:
    found = set()
    for path in sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            found.add(relative)
        for node in ast.walk(ast.parse(text, filename=relative)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                    found.add(f"{relative}:{node.name}")
    return found


def test_no_module_over_400_lines_and_no_function_over_80() -> None:
    found = oversized()
    assert not found - OVER_THE_LIMIT, (
        f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function: {sorted(found - OVER_THE_LIMIT)}"
    )
    assert not OVER_THE_LIMIT - found, (
        f"back under the limits, take off OVER_THE_LIMIT: {sorted(OVER_THE_LIMIT - found)}"
    )


def server_domain(module: str) -> str | None:
    """The server domain (a folder under ``server/``: builds, sweeps, runs, ...) of a module."""
    parts = module.split(".")
    if parts[0] != "server" or len(parts) < 2 or not (ROOT / "server" / parts[1]).is_dir():
        return None
    return parts[1]


def test_no_two_server_domains_import_each_other(graph: dict[str, set[str]]) -> None:
    # One domain uses another, never both ways: what both need lives in the lower one or in a
    # shared module beside them (server/models.py, server/build_reports.py, ...).
    between: dict[tuple[str, str], list[str]] = defaultdict(list)
    for source, targets in graph.items():
        for target in targets:
            ends = server_domain(source), server_domain(target)
            if ends[0] and ends[1] and ends[0] != ends[1]:
                between[(ends[0], ends[1])].append(f"{source} -> {target}")
    both_ways = [
        f"{one} <-> {other}: " + ", ".join(sorted(between[(one, other)] + between[(other, one)]))
        for one, other in sorted(between)
        if one < other and (other, one) in between
    ]
    assert not both_ways, "server domains that import each other:\n" + "\n".join(both_ways)
