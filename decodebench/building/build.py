"""Build one variant end to end: model -> sensitivity -> Core ML package -> analysis -> build.json.

The output directory holds ``model.mlpackage`` and ``build.json`` (a :class:`BuildReport`).
Both are replaced atomically, so a crashed build never leaves a half-written artifact behind
a valid-looking report. A build is keyed by (model identity, variant, toolchain): an identical
request is answered from ``out_dir`` itself or from the :class:`~decodebench.building.cache.BuildCache`.
With a cache, a model's sensitivity ranking is measured once and reused by its other variants
(:mod:`decodebench.building.quant.ranking`).

The stages run one after the other. Overlapping the sensitivity (torch, GIL released in its
kernels) with tracing and conversion (pure Python) was measured and gained nothing: the
sensitivity's thousands of short kernels each wait for the GIL the converter holds.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from decodebench.analysis.analyze import analyze_mlpackage
from decodebench.building.cache import (
    PACKAGE_NAME,
    REPORT_NAME,
    BuildCache,
    find_build,
    model_identity,
    request_key,
)
from decodebench.contracts.build import BuildReport, QuantSummary
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.presets import REGISTRY_MODELS, ModelConfig, get_preset
from decodebench.contracts.recipes import TARGETS, parse_recipe
from decodebench.toolchain import CODE_KEY, installed_toolchain, toolchain_identity

if TYPE_CHECKING:
    from decodebench.building.convert import Converter

ProgressCallback = Callable[[str, float], None]

# Share of the whole build each stage takes (measured on EXAONE-sized top8 builds, roughly), so
# the progress fraction moves evenly.
STAGE_WEIGHTS: dict[str, float] = {
    "build_model": 0.12,
    "load_weights": 0.12,
    "sensitivity": 0.34,
    "trace": 0.03,
    "convert": 0.23,
    "quantize": 0.15,
    "save": 0.11,
    "check_finite": 0.01,
    "analyse": 0.01,
}


class BuildError(ValueError):
    """The variant cannot be built with this toolchain (the message names the field)."""


class StageClock:
    """Times named stages and reports progress as the cumulative share of finished work."""

    def __init__(self, progress: ProgressCallback | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self._progress = progress
        self._done = 0.0

    def _report(self, name: str, fraction: float) -> None:
        if self._progress is not None:
            self._progress(name, min(1.0, round(fraction, 4)))

    def within(self, name: str, fraction: float) -> None:
        """Progress inside a running stage (``fraction`` of that stage done)."""
        self._report(name, self._done + STAGE_WEIGHTS.get(name, 0.0) * fraction)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self._report(name, self._done)
        started = time.perf_counter()
        try:
            yield
        finally:
            # A stage may run more than once (one conversion per function): times add up.
            elapsed = time.perf_counter() - started
            self.seconds[name] = round(self.seconds.get(name, 0.0) + elapsed, 3)
        self._done += STAGE_WEIGHTS.get(name, 0.0)
        self._report(name, self._done)


def toolchain_versions(converter: Converter | None = None) -> dict[str, str]:
    """What makes an artifact reproducible: our own version plus the converter's."""
    installed = installed_toolchain()
    if converter is None:
        return installed
    return {
        "decodebench": installed["decodebench"],
        CODE_KEY: installed[CODE_KEY],
        **toolchain_identity(converter.versions()),
    }


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (a lifetime high-water mark)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def resolve_config(model: str, variant: VariantSpec) -> ModelConfig:
    config = get_preset(model)
    if variant.layers is not None:
        config = config.model_copy(update={"num_layers": variant.layers})
    return config


def validate_for_config(variant: VariantSpec, config: ModelConfig) -> None:
    """What only the model can tell: raises :class:`BuildError` naming the field."""
    recipe = parse_recipe(variant.quant)
    if recipe.promote_top > config.num_layers:
        raise BuildError(
            f"quant: top{recipe.promote_top} promotes more layers than the model's "
            f"{config.num_layers}"
        )


def _replace_directory(source: Path, target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    os.replace(source, target)


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def build_variant(
    model: str,
    variant: VariantSpec,
    out_dir: Path,
    progress: ProgressCallback | None = None,
    converter: Converter | None = None,
    *,
    weights: Path | None = None,
    cache: BuildCache | None = None,
    weights_fingerprint: str | None = None,
) -> BuildReport:
    """Build, convert, quantize, save and analyse one variant into ``out_dir``.

    ``model`` is a preset name, or a label when ``weights`` names a Hugging Face folder. With a
    ``cache``, an identical earlier build is restored instead (``report.cache_hit``).
    ``weights_fingerprint`` identifies ``weights`` when the caller knows its content already (a
    worker building an uploaded model: the content hash the server keys the build by).
    """
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = weights_fingerprint
    if weights is None and model in REGISTRY_MODELS:
        # A registry model is pinned to one release: its name is its identity, so the server
        # keys its builds without the weights; they are fetched once and cached.
        from decodebench.building.realmodels import fetch_model

        weights = fetch_model(model)
    elif weights is not None and fingerprint is None:
        from decodebench.building.weights import fingerprint as hash_folder

        memo = (cache.root if cache else out_dir) / "fingerprints.json"
        fingerprint = hash_folder(weights, memo)
    identity = model_identity(model, fingerprint)
    toolchain = toolchain_versions(converter)
    key = request_key(identity, variant, toolchain)

    found = find_build(out_dir, key, cache)
    if found is not None:
        return found.model_copy(
            update={"cache_hit": True, "wall_seconds": round(time.perf_counter() - started, 3)}
        )

    report = _build(
        model, identity, key, variant, out_dir, progress, converter, weights, toolchain, cache
    )
    if progress is not None:
        progress("done", 1.0)
    report.wall_seconds = round(time.perf_counter() - started, 3)
    _write_atomically(out_dir / REPORT_NAME, report.model_dump_json(indent=2))
    if cache is not None:
        cache.store(key, out_dir)
    return report


def _build(
    model: str,
    identity: str,
    key: str,
    variant: VariantSpec,
    out_dir: Path,
    progress: ProgressCallback | None,
    converter: Converter | None,
    weights: Path | None,
    toolchain: dict[str, str],
    cache: BuildCache | None,
) -> BuildReport:
    import torch

    from decodebench.building.convert import DEFAULT_CONVERTER, PREFILL_FUNCTION
    from decodebench.building.quant.apply import QuantPlan
    from decodebench.building.quant.ranking import sensitivity_report
    from decodebench.modeling import build_model

    converter = converter or DEFAULT_CONVERTER
    clock = StageClock(progress)
    recipe = parse_recipe(variant.quant)
    # fp16 from the start: the package stores fp16 anyway, and the EXAONE shape in fp32
    # would need twice the memory for nothing.
    if weights is not None:
        from decodebench.building.weights import load_checkpoint

        with clock.stage("load_weights"):
            config, tensors = load_checkpoint(weights, torch.float16, variant.layers)
            torch_model = build_model(
                config, variant.context, variant.attention, torch.float16, variant.kv,
                weights=tensors,
            )  # fmt: skip
            del tensors
    else:
        config = resolve_config(model, variant)
        validate_for_config(variant, config)  # before seconds of building, when it can
        with clock.stage("build_model"):
            torch_model = build_model(
                config, variant.context, variant.attention, torch.float16, variant.kv
            )
    validate_for_config(variant, config)

    plan = QuantPlan(recipe, config.tie_word_embeddings)
    sensitivity = None
    if recipe.needs_sensitivity:
        with clock.stage("sensitivity"):
            sensitivity = sensitivity_report(
                torch_model, plan, identity, key, toolchain, cache,
                lambda fraction: clock.within("sensitivity", fraction),
            )  # fmt: skip
            plan.promote(frozenset(sensitivity.promoted))

    functions = {"main": torch_model}
    if variant.prefill_chunk is not None:
        functions[PREFILL_FUNCTION] = torch_model.sibling(variant.prefill_chunk)
    parameter_names = [name for name, _ in torch_model.named_parameters()]
    # From here the converter holds the only references and drops each model once converted:
    # the fp16 weights are then freed while quantization replaces them (~2.4 GB at EXAONE size).
    del torch_model

    package = out_dir / PACKAGE_NAME
    # A report from an earlier build must not describe the package about to replace it.
    (out_dir / REPORT_NAME).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".building-") as staging:
        staged = Path(staging) / PACKAGE_NAME
        rewritten = converter.build_package(functions, config, variant, staged, plan, clock)
        plan._cache.clear()
        with clock.stage("check_finite"):
            check_finite_decode(staged)
        _replace_directory(staged, package)

    with clock.stage("analyse"):
        analysis = analyze_mlpackage(package)

    quant = None
    if not recipe.is_fp16:
        constexpr_ops: dict[str, int] = {}
        for op_type in rewritten.values():
            constexpr_ops[op_type] = constexpr_ops.get(op_type, 0) + 1
        quant = QuantSummary(
            recipe=recipe.canonical,
            schemes={target: recipe.scheme(target).text for target in TARGETS},
            promoted_layers=sorted(plan.promoted),
            constexpr_ops=constexpr_ops,
            weights={choice.name: choice.scheme for choice in plan.choices(parameter_names)},
            sensitivity=sensitivity,
        )
    return BuildReport(
        key=key,
        model=model,
        variant=variant,
        config=config,
        toolchain=toolchain,
        stage_seconds=clock.seconds,
        peak_rss_bytes=peak_rss_bytes(),
        package=PACKAGE_NAME,
        analysis=analysis,
        model_identity=identity,
        weights_path=str(weights) if weights is not None else None,
        functions=analysis.functions,
        quant=quant,
    )


# Decode steps the publish check runs after its prompt: enough to exercise the cache it wrote.
FINITE_CHECK_STEPS = 2


def check_finite_decode(package: Path) -> None:
    """Refuse a package whose decode, run in the reference interpreter on one prompt, makes a
    non-finite value (an fp16 overflow would make the device decode garbage)."""
    from decodebench.building.agreement import PackageDecoder
    from decodebench.mil.defaults import DEFAULT_PROMPT
    from decodebench.mil.interpreter import NonFiniteError

    try:
        PackageDecoder(package).greedy(DEFAULT_PROMPT, FINITE_CHECK_STEPS)
    except NonFiniteError as error:
        raise BuildError(f"not published: the decode is not finite: {error}") from None


def load_report(out_dir: Path) -> BuildReport:
    return BuildReport.model_validate_json((out_dir / REPORT_NAME).read_text())
