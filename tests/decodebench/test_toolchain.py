"""One toolchain identity: the worker's own build key equals the key the server assigned."""

from __future__ import annotations

import pytest

from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.variants import build_key
from decodebench.toolchain import (
    ToolchainMismatch,
    check_toolchain,
    format_toolchain,
    installed_toolchain,
    toolchain_identity,
)
from server.config import Settings


def test_local_version_labels_do_not_change_the_identity() -> None:
    assert toolchain_identity({"torch": "2.13.0+cpu", "coremltools": "9.0"}) == {
        "torch": "2.13.0",
        "coremltools": "9.0",
    }


@pytest.mark.parametrize("format_name", ["coreml", "coreai"])
def test_the_server_and_this_host_key_a_build_alike(format_name: str) -> None:
    server_toolchain = format_toolchain(Settings().toolchain, format_name)
    installed = installed_toolchain(format_name)
    check_toolchain(server_toolchain, installed)
    assert set(server_toolchain) == set(installed)
    variant = VariantSpec(format=format_name, context=64)
    assert build_key("tiny-gqa", variant, server_toolchain) == build_key(
        "tiny-gqa", variant, installed
    )


def test_a_core_ml_build_keeps_its_key_beside_core_ais_packages() -> None:
    everything = Settings().toolchain
    coreml = format_toolchain(everything, "coreml")

    assert set(coreml) == {"decodebench", "torch", "coremltools", "code"}
    assert set(format_toolchain(everything, "coreai")) == {
        "decodebench", "torch", "coreai-core", "coreai-torch", "coreai-opt", "code"
    }  # fmt: skip
    assert build_key("tiny-gqa", VariantSpec(), coreml) != build_key(
        "tiny-gqa", VariantSpec(format="coreai"), format_toolchain(everything, "coreai")
    )


def test_another_release_is_refused_by_name() -> None:
    with pytest.raises(ToolchainMismatch, match="build expects coremltools 8.3, this host has 9.0"):
        check_toolchain({"coremltools": "8.3"}, {"coremltools": "9.0"})


def test_a_change_to_the_building_code_misses_the_build_cache(tmp_path) -> None:
    """The key carries a fingerprint of the converter's own source: edit it (here in a copy of
    the package) and a cached package built by the old code is no longer served."""
    import json
    import shutil

    from decodebench.building.cache import BuildCache
    from decodebench.contracts.names import PACKAGE_NAME, REPORT_NAME
    from decodebench.toolchain import BUILDING_CODE, PACKAGE_ROOT, code_fingerprint
    from scripts.standins import MINIMAL_ANALYSIS, build_report

    copy = tmp_path / "decodebench"
    for module in BUILDING_CODE:
        source = PACKAGE_ROOT / module
        if source.is_dir():
            shutil.copytree(source, copy / module, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (copy / module).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / module)
    before = code_fingerprint(copy)
    assert before == code_fingerprint()  # the copy is this code
    variant = VariantSpec()
    toolchain = {**installed_toolchain(), "code": before}
    key = build_key("tiny-gqa", variant, toolchain)
    out = tmp_path / "out"
    (out / PACKAGE_NAME).mkdir(parents=True)
    (out / PACKAGE_NAME / "Manifest.json").write_text("{}")
    build = {"key": key, "model": "tiny-gqa", "toolchain": toolchain,
             "variant": variant.model_dump(mode="json")}  # fmt: skip
    (out / REPORT_NAME).write_text(json.dumps(build_report(build, MINIMAL_ANALYSIS)))
    cache = BuildCache(tmp_path / "cache")
    cache.store(key, out)
    assert cache.lookup(key) is not None

    with (copy / "formats" / "coreml" / "convert.py").open("a") as source:
        source.write("\n# a graph change\n")
    after = code_fingerprint(copy)
    assert after != before
    changed = build_key("tiny-gqa", variant, {**toolchain, "code": after})
    assert changed != key and cache.lookup(changed) is None
    # A worker on other code refuses the server's build by name rather than mislabel it.
    with pytest.raises(ToolchainMismatch, match=f"build expects code {before}, this host has"):
        check_toolchain(toolchain, {**toolchain, "code": after})


def test_the_doctor_is_not_building_code_and_every_format_is(tmp_path) -> None:
    """Editing a doctor module leaves the fingerprint alone (no build is made by it), editing any
    module in a format's folder moves it: the interpreter and the fold shape what a build proves."""
    import shutil

    from decodebench.toolchain import PACKAGE_ROOT, code_fingerprint

    copy = tmp_path / "decodebench"
    shutil.copytree(PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = code_fingerprint(copy)
    assert before == code_fingerprint()
    with (copy / "doctor" / "repair.py").open("a") as source:
        source.write("\n# a doctor change\n")
    assert code_fingerprint(copy) == before
    with (copy / "formats" / "coreml" / "interpreter.py").open("a") as source:
        source.write("\n# an interpreter change\n")
    assert code_fingerprint(copy) != before
