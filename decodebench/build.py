"""Build one variant end to end: torch model -> Core ML package -> graph analysis -> build.json.

The output directory holds ``model.mlpackage`` and ``build.json`` (a :class:`BuildReport`).
Both are replaced atomically, so a crashed build never leaves a half-written artifact behind
a valid-looking report.
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
from importlib import metadata
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict

from decodebench.analysis import GraphAnalysis, analyze_mlpackage
from decodebench.convert import DEFAULT_CONVERTER, Converter
from decodebench.domain import Quant, VariantSpec, build_key
from decodebench.modeling import build_model
from decodebench.presets import ModelConfig, get_preset

PACKAGE_NAME = "model.mlpackage"
REPORT_NAME = "build.json"

ProgressCallback = Callable[[str, float], None]

# Share of the whole build each stage takes (measured on EXAONE-sized builds, roughly), so the
# progress fraction moves evenly.
STAGE_WEIGHTS: dict[str, float] = {
    "build_model": 0.05,
    "trace": 0.10,
    "convert": 0.65,
    "save": 0.15,
    "analyse": 0.05,
}


class BuildError(ValueError):
    """The variant cannot be built with this toolchain."""


class BuildReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str
    model: str
    variant: VariantSpec
    config: ModelConfig
    toolchain: dict[str, str]
    stage_seconds: dict[str, float]
    peak_rss_bytes: int
    package: str
    analysis: GraphAnalysis


class StageClock:
    """Times named stages and reports progress as the cumulative share of finished work."""

    def __init__(self, progress: ProgressCallback | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self._progress = progress
        self._done = 0.0

    def _report(self, name: str, fraction: float) -> None:
        if self._progress is not None:
            self._progress(name, min(1.0, round(fraction, 4)))

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self._report(name, self._done)
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(time.perf_counter() - started, 3)
        self._done += STAGE_WEIGHTS.get(name, 0.0)
        self._report(name, self._done)


def toolchain_versions(converter: Converter = DEFAULT_CONVERTER) -> dict[str, str]:
    """What makes an artifact reproducible: our own version plus the converter's."""
    try:
        own_version = metadata.version("decodebench")
    except metadata.PackageNotFoundError:
        own_version = "unknown"
    return {"decodebench": own_version, **converter.versions()}


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far (a lifetime high-water mark)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def resolve_config(model: str, variant: VariantSpec) -> ModelConfig:
    config = get_preset(model)
    if variant.layers is not None:
        config = config.model_copy(update={"num_layers": variant.layers})
    return config


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
    converter: Converter = DEFAULT_CONVERTER,
) -> BuildReport:
    """Build, convert, save and analyse one variant into ``out_dir``; returns the report."""
    if variant.quant != Quant.fp16:
        raise BuildError(f"quantization {variant.quant.value!r} is not supported yet")
    config = resolve_config(model, variant)
    toolchain = toolchain_versions(converter)
    out_dir.mkdir(parents=True, exist_ok=True)
    clock = StageClock(progress)

    with clock.stage("build_model"):
        # fp16 from the start: the package stores fp16 anyway, and the EXAONE shape in fp32
        # would need twice the memory for nothing (weights are drawn in fp32, rounded once).
        torch_model = build_model(config, variant.context, variant.attention, torch.float16)
    mlmodel = converter.convert(torch_model, config, variant, clock)
    del torch_model  # the package holds the weights now; free the torch copy before saving

    package = out_dir / PACKAGE_NAME
    with clock.stage("save"):
        # A report from an earlier build must not describe the package about to replace it.
        (out_dir / REPORT_NAME).unlink(missing_ok=True)
        with tempfile.TemporaryDirectory(dir=out_dir, prefix=".saving-") as staging:
            staged = Path(staging) / PACKAGE_NAME
            converter.save(mlmodel, staged)
            _replace_directory(staged, package)
    del mlmodel

    with clock.stage("analyse"):
        analysis = analyze_mlpackage(package)

    report = BuildReport(
        key=build_key(model, variant, toolchain),
        model=model,
        variant=variant,
        config=config,
        toolchain=toolchain,
        stage_seconds=clock.seconds,
        peak_rss_bytes=peak_rss_bytes(),
        package=PACKAGE_NAME,
        analysis=analysis,
    )
    _write_atomically(out_dir / REPORT_NAME, report.model_dump_json(indent=2))
    return report


def load_report(out_dir: Path) -> BuildReport:
    return BuildReport.model_validate_json((out_dir / REPORT_NAME).read_text())
