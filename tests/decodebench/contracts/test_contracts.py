"""The contracts and the server stand without torch and coremltools; every API response is
declared, and the contracts import nothing but pydantic, light stdlib and each other (the catalogs
they validate against live among them)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

HEAVY = ("torch", "coremltools", "transformers", "pymobiledevice3")

# Makes the heavy packages unimportable in a fresh interpreter, then imports the given modules.
BLOCKED_IMPORT = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {heavy!r}:
            raise ImportError(f"{{name}} is blocked for this test")
sys.meta_path.insert(0, Block())
{imports}
loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({heavy!r}))
assert not loaded, loaded
print("ok")
"""


def _import_without_heavy(*modules: str) -> subprocess.CompletedProcess[str]:
    imports = "\n".join(f"import {module}" for module in modules)
    return subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORT.format(heavy=HEAVY, imports=imports)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_server_app_imports_without_torch_or_coremltools() -> None:
    done = _import_without_heavy("server.app", "server.manage", "server.tasks")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


def test_the_client_and_cli_import_without_torch_or_coremltools() -> None:
    done = _import_without_heavy("decodebench.client", "decodebench.cli", "decodebench.contracts")
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_blocker_itself_blocks() -> None:
    done = _import_without_heavy("decodebench.formats.coreml.graph")  # reads with coremltools
    assert done.returncode != 0 and "blocked for this test" in done.stderr


ALLOWED_IN_CONTRACTS = "decodebench.contracts."


@pytest.mark.parametrize(
    "module", sorted((ROOT / "decodebench" / "contracts").glob("*.py")), ids=lambda p: p.name
)
def test_contracts_import_only_pydantic_the_stdlib_and_each_other(module: Path) -> None:
    tree = ast.parse(module.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            name = node.module
        elif isinstance(node, ast.Import):
            name = node.names[0].name
        else:
            continue
        top = name.split(".")[0]
        if top == "decodebench":
            assert name.startswith(ALLOWED_IN_CONTRACTS), f"{module.name} imports {name}"
        else:
            assert top in {"__future__", "pydantic", "typing", "enum", "datetime", "re",
                           "hashlib", "json", "collections", "contextvars"}, f"{module.name} imports {name}"  # fmt: skip


def test_every_api_operation_declares_its_response_schema() -> None:
    from server.app import create_app

    schema = create_app().openapi()
    undeclared = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if not status.startswith("2") or status == "204":
                    continue
                content = response.get("content", {})
                body = content.get("application/json", {}).get("schema")
                zipped = path.startswith("/api/v1/artifacts/") or path.endswith("/package")
                if zipped and method == "get":
                    body = content.get("application/zip", {}).get("schema")
                if not body or body == {}:
                    undeclared.append(f"{method.upper()} {path} {status}")
    assert not undeclared, undeclared


def test_a_variant_names_its_format_and_the_default_keeps_every_build_key() -> None:
    """The format joined the variant after builds were keyed: at its default (coreml) it is out
    of the key, so every stored key still means what it meant; an unknown one is refused."""
    from pydantic import ValidationError

    from decodebench.contracts.variants import VariantSpec, build_key

    toolchain = {"torch": "2.13.0", "coremltools": "9.0"}
    plain = VariantSpec(context=128)
    named = VariantSpec(context=128, format="coreml")
    assert "format" not in plain.graph_identity()
    assert build_key("tiny-gqa", named, toolchain) == build_key("tiny-gqa", plain, toolchain)
    # The key of this variant as builds were keyed before the format existed.
    before = {"attention": "folded", "context": 128, "layers": None, "quant": "fp16"}
    assert plain.graph_identity() == before
    with pytest.raises(ValidationError, match="format"):
        VariantSpec(format="onnx")


def test_an_uploaded_package_says_its_format_and_the_old_kind_still_reads() -> None:
    from pydantic import ValidationError

    from decodebench.contracts.uploads import ModelKind, ModelRegistration

    files = [{"path": "m.zip", "sha256": "0" * 64}]
    old = ModelRegistration(name="m", kind="mlpackage", files=files)
    assert old.kind == ModelKind.package and old.format is None
    assert ModelRegistration(name="m", kind="package", format="coreml", files=files).format
    with pytest.raises(ValidationError, match="only a package has a model format"):
        ModelRegistration(name="m", kind="gguf", format="coreml", files=files)
