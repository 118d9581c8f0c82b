"""One build's pieces that every source shares: the job (what is asked, how it is keyed, where
it goes), its stage clock, the conversion of a loaded decoder, the finite check and the report.

:mod:`decodebench.building.build` runs a build through them; each
:class:`~decodebench.building.sources.Source` uses them to make its package.
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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from decodebench.analysis.analyze import GraphAnalysis, analyze_graphs, analyze_mlpackage
from decodebench.building.cache import (
    PACKAGE_NAME,
    REPORT_NAME,
    BuildCache,
)
from decodebench.contracts.build import BuildReport, QuantSummary
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.names import ARTIFACT_NAMES, DEFAULT_FORMAT
from decodebench.contracts.presets import ModelConfig, get_preset
from decodebench.contracts.recipes import TARGETS, QuantRecipe
from decodebench.formats import get_format
from decodebench.formats.seam import ModelFormat, ReferenceDisagreement
from decodebench.toolchain import CODE_KEY, installed_toolchain, toolchain_identity

if TYPE_CHECKING:
    from decodebench.formats.coreml.convert import Converter

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
    "hold_to_reference": 0.05,
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


def toolchain_versions(
    converter: Converter | None = None, format_name: str = "coreml"
) -> dict[str, str]:
    """What makes an artifact reproducible: our own version plus the converter's."""
    installed = installed_toolchain(format_name)
    if converter is None or format_name != "coreml":
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


def validate_for_config(recipe: QuantRecipe, config: ModelConfig, kv_window: bool = False) -> None:
    """What only the model can tell: raises :class:`BuildError` naming the field."""
    if kv_window and not any(config.sliding_layers or ()):
        raise BuildError(
            f"kv_window: {config.name} has no sliding-window layers (the windowed KV layout "
            "caches only a sliding layer's window)"
        )
    if recipe.promote_top > config.num_layers:
        raise BuildError(
            f"quant: top{recipe.promote_top} promotes more layers than the model's "
            f"{config.num_layers}"
        )


def replace_directory(source: Path, target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    os.replace(source, target)


def write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


@dataclass
class Job:
    """One build as its source makes it: what is asked, how it is keyed, where it goes."""

    model: str
    variant: VariantSpec
    recipe: QuantRecipe
    identity: str
    key: str
    toolchain: dict[str, str]
    out_dir: Path
    clock: StageClock
    converter: Converter | None
    cache: BuildCache | None

    def report(self, config: ModelConfig, analysis: GraphAnalysis, **fields: Any) -> BuildReport:
        """The report of the package now in ``out_dir`` (wall time set by :func:`build`)."""
        return BuildReport(
            key=self.key,
            model=self.model,
            variant=self.variant,
            config=config,
            toolchain=self.toolchain,
            stage_seconds=self.clock.seconds,
            peak_rss_bytes=peak_rss_bytes(),
            package=ARTIFACT_NAMES[self.variant.format],
            analysis=analysis,
            model_identity=self.identity,
            functions=analysis.functions,
            **fields,
        )


def convert_job(
    job: Job, config: ModelConfig, torch_model: Any, weights: Path | None
) -> BuildReport:
    """Sensitivity, conversion, quantization, the finite check and the analysis of a loaded
    decoder (``torch_model``, fp16, built for ``config``) into ``job.out_dir``."""
    if job.variant.format != DEFAULT_FORMAT:
        return convert_in_format(job, config, torch_model, weights)
    from decodebench.building.ranking import sensitivity_report
    from decodebench.formats.coreml.convert import DEFAULT_CONVERTER, PREFILL_FUNCTION, Conversion
    from decodebench.formats.coreml.quant.apply import QuantPlan

    converter = job.converter or DEFAULT_CONVERTER
    clock, recipe, variant = job.clock, job.recipe, job.variant
    plan = QuantPlan(recipe, config.tie_word_embeddings)
    sensitivity = None
    if recipe.needs_sensitivity:
        with clock.stage("sensitivity"):
            sensitivity = sensitivity_report(
                torch_model, plan, job.identity, job.key, job.toolchain, job.cache,
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

    package = job.out_dir / PACKAGE_NAME
    # A report from an earlier build must not describe the package about to replace it.
    (job.out_dir / REPORT_NAME).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(dir=job.out_dir, prefix=".building-") as staging:
        staged = Path(staging) / PACKAGE_NAME
        rewritten = converter.build_package(
            functions, Conversion(config, variant, clock), staged, plan
        )
        plan._cache.clear()
        with clock.stage("check_finite"):
            check_finite_decode(staged)
        replace_directory(staged, package)

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
    return job.report(
        config, analysis, weights_path=str(weights) if weights is not None else None, quant=quant
    )


def convert_in_format(
    job: Job, config: ModelConfig, torch_model: Any, weights: Path | None
) -> BuildReport:
    """The build of a variant in a format other than Core ML, through the format seam: convert
    into a staged package, the finite check on the format's engine, the analysis. The format
    applies the variant's recipe (``quant``) itself, refusing by name one it cannot."""
    model_format = get_format(job.variant.format)
    clock, variant = job.clock, job.variant
    functions = {"main": torch_model}
    if variant.prefill_chunk is not None:
        functions["prefill"] = torch_model.sibling(variant.prefill_chunk)
    del torch_model
    package = job.out_dir / model_format.artifact_name
    (job.out_dir / REPORT_NAME).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(dir=job.out_dir, prefix=".building-") as staging:
        staged = Path(staging) / model_format.artifact_name
        try:
            model_format.build_package(functions, config, variant, staged, None, clock)
        except ValueError as error:
            raise BuildError(str(error)) from None
        with clock.stage("check_finite"):
            check_finite_decode(staged, variant.format)
        with clock.stage("hold_to_reference"):
            held = hold_to_reference(model_format, staged)
        replace_directory(staged, package)
    with clock.stage("analyse"):
        analysis, graphs = analyze_graphs(package, variant.format)
        warnings = model_format.known_faults(graphs)
    return job.report(
        config,
        analysis,
        weights_path=str(weights) if weights is not None else None,
        reference_check=held,
        warnings=warnings,
    )


def hold_to_reference(model_format: ModelFormat, staged: Path) -> str | None:
    """The format's own runtime as the arbiter of the staged package (Core AI: Apple's)."""
    try:
        return model_format.hold_to_reference(staged)
    except ReferenceDisagreement as error:
        raise BuildError(f"not published: the engine disagrees with {error}") from None


# The publish check's prompt (as the Core ML check's) and its decode steps after it: enough to
# exercise the cache it wrote.
DEFAULT_FINITE_PROMPT = (1, 2, 3, 4)
FINITE_CHECK_STEPS = 2


def check_finite_decode(package: Path, format_name: str = DEFAULT_FORMAT) -> None:
    """Refuse a package whose decode, run in the reference interpreter on one prompt, makes a
    non-finite value (an fp16 overflow would make the device decode garbage)."""
    if format_name != DEFAULT_FORMAT:
        from decodebench.formats.seam import NonFiniteValue

        session = get_format(format_name).open_engine(package)
        try:
            *prompt, last = DEFAULT_FINITE_PROMPT
            session.prefill(prompt)
            token, position = last, len(prompt)
            for _ in range(FINITE_CHECK_STEPS):
                token = session.next_token(token, position)
                position += 1
        except NonFiniteValue as error:
            raise BuildError(f"not published: the decode is not finite: {error}") from None
        return
    from decodebench.building.agreement import PackageDecoder
    from decodebench.formats.coreml.defaults import DEFAULT_PROMPT
    from decodebench.formats.coreml.interpreter import NonFiniteError

    try:
        PackageDecoder(package).greedy(DEFAULT_PROMPT, FINITE_CHECK_STEPS)
    except NonFiniteError as error:
        raise BuildError(f"not published: the decode is not finite: {error}") from None


def load_report(out_dir: Path) -> BuildReport:
    return BuildReport.model_validate_json((out_dir / REPORT_NAME).read_text())
