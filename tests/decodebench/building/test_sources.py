"""One build, one path: the source is chosen once, the recipe parsed once, the model fetched once,
whether the build is asked for locally or assigned by the server."""

from __future__ import annotations

from pathlib import Path

import pytest

import decodebench.building.build as build_module
import decodebench.building.realmodels as realmodels
import decodebench.contracts.recipes as recipe_module
from decodebench.building.assignment import assignment_source, build_assignment
from decodebench.building.build import build_variant, toolchain_versions
from decodebench.building.sources import (
    PackageSource,
    PresetSource,
    RegistrySource,
    SourceError,
    local_source,
)
from decodebench.contracts.domain import Attention, VariantSpec
from decodebench.contracts.variants import build_key
from decodebench.contracts.workers import BuildAssignment

VARIANT = VariantSpec(context=64, attention=Attention.folded)


@pytest.fixture
def calls(monkeypatch, tiny_llama_folder) -> dict[str, int]:
    """Counts parse_recipe and fetch_model; the registry model is the tiny checkpoint."""
    counted = {"parse_recipe": 0, "fetch_model": 0}
    parse = recipe_module.parse_recipe

    def counting_parse(text: str):
        counted["parse_recipe"] += 1
        return parse(text)

    def counting_fetch(name: str, *args, **kwargs) -> Path:
        counted["fetch_model"] += 1
        assert name == "smollm2-135m"
        return tiny_llama_folder

    monkeypatch.setattr(build_module, "parse_recipe", counting_parse)
    monkeypatch.setattr(recipe_module, "parse_recipe", counting_parse)
    monkeypatch.setattr(realmodels, "fetch_model", counting_fetch)
    return counted


def test_a_preset_build_parses_its_recipe_once_and_fetches_nothing(calls, tmp_path) -> None:
    report = build_variant("tiny-gqa", VARIANT, tmp_path)
    assert calls == {"parse_recipe": 1, "fetch_model": 0}
    assert report.model_identity == "tiny-gqa" and report.weights_path is None


def test_an_assigned_registry_build_fetches_its_model_once(
    calls, tmp_path, tiny_llama_folder
) -> None:
    identity = "smollm2-135m"  # a registry model is keyed by its name, not its weights
    assignment = BuildAssignment(
        build_id=1, key=build_key(identity, VARIANT, toolchain_versions()), model=identity,
        variant=VARIANT, state="building", toolchain=toolchain_versions(),
    )  # fmt: skip
    stages: list[str] = []
    report = build_assignment(
        None,  # type: ignore[arg-type]  # a registry model needs nothing from the server
        assignment, tmp_path / "work", tmp_path / "out",
        lambda stage, fraction: stages.append(stage),
    )  # fmt: skip
    assert calls == {"parse_recipe": 1, "fetch_model": 1}
    assert report.key == assignment.key and report.model_identity == identity
    assert report.weights_path == str(tiny_llama_folder)
    assert stages[0] == "fetch" and stages[1] == "load_weights" and stages[-1] == "done"
    again = build_assignment(
        None,  # type: ignore[arg-type]
        assignment, tmp_path / "work", tmp_path / "again", lambda stage, fraction: None,
    )  # fmt: skip
    assert again.cache_hit and calls == {"parse_recipe": 2, "fetch_model": 2}


def test_the_source_is_chosen_once_from_the_spec(tmp_path) -> None:
    assert type(local_source("tiny-gqa")) is PresetSource
    assert type(local_source("smollm2-135m")) is RegistrySource
    checkpoint = local_source("mine", tmp_path, "ab" * 32)
    assert checkpoint.weights == tmp_path
    assert checkpoint.identity(tmp_path / "memo.json") == f"mine@sha256:{'ab' * 32}"
    package = PackageSource(checkpoint, None, "cd" * 32)
    assert package.identity(tmp_path) == f"mine@sha256:{'ab' * 32}+package@sha256:{'cd' * 32}"
    assert not package.cached and not package.converts

    class Client:
        def get_model(self, name: str):
            raise AssertionError(f"a preset asks the server for nothing, not {name}")

    assignment = BuildAssignment(
        build_id=1, key="k", model="tiny-gqa", variant=VARIANT, state="building", toolchain={}
    )
    assert type(assignment_source(Client(), assignment, tmp_path)) is PresetSource  # type: ignore[arg-type]


def test_an_uploaded_package_that_is_no_package_is_refused(tmp_path) -> None:
    from decodebench.contracts.uploads import ModelKind

    class View:
        name, kind = "weights", ModelKind.hf

    class Client:
        def get_model(self, name: str) -> View:
            return View()

    variant = VariantSpec(package="weights", context=64)
    assignment = BuildAssignment(
        build_id=1, key="k", model="tiny-gqa", variant=variant, state="building", toolchain={}
    )
    with pytest.raises(SourceError, match="package: weights is not a .mlpackage"):
        assignment_source(Client(), assignment, tmp_path)  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_tokenizer_models_references_come_from_the_folder_fetched_for_its_build(
    smollm2_folder, tmp_path, monkeypatch
) -> None:
    """SmolLM2 cut to two layers: one fetch serves the build and its references, and the
    report carries the key the server gave the build with its prompts."""
    from decodebench.contracts.domain import prompt_set_identity
    from decodebench.contracts.workers import PromptSetRequest

    fetched: list[str] = []

    def fetch(name: str, *args, **kwargs) -> Path:
        fetched.append(name)
        return smollm2_folder

    monkeypatch.setattr(realmodels, "fetch_model", fetch)
    uploaded: list[Path] = []

    class Client:
        def upload_artifact(self, path: Path) -> str:
            uploaded.append(path)
            return "ef" * 32

    variant = VariantSpec(context=64, layers=2, attention=Attention.folded)
    texts = ["What is the capital of France?"]
    request = PromptSetRequest(
        texts=texts, count=1, decode_tokens=4, identity=prompt_set_identity(texts, 1, 4)
    )
    toolchain = toolchain_versions()
    key = build_key("smollm2-135m", variant, toolchain, request.identity)
    assignment = BuildAssignment(
        build_id=1, key=key, model="smollm2-135m", variant=variant, state="building",
        toolchain=toolchain, prompt_set=request,
    )  # fmt: skip
    report = build_assignment(
        Client(),  # type: ignore[arg-type]
        assignment, tmp_path / "work", tmp_path / "out", lambda stage, fraction: None,
    )  # fmt: skip
    assert fetched == ["smollm2-135m"] and len(uploaded) == 1
    assert report.key == key and report.references is not None
    assert report.references.detokenizer_sha256 == "ef" * 32
    assert len(report.references.prompts[0].reference_ids) == 4
