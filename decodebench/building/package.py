"""A build from a ``.mlpackage`` made elsewhere ("bring your own package").

Nothing is converted: the package is analysed like any build, its KV length checked against the
variant's context, optionally folded (``decodebench fold``: GQA KV replication removed where it
is provably exact) and then verified against the package as uploaded over a few decode steps in
the reference interpreter, checked for non-finite values on a prompt, analysed again, and
written as ``model.mlpackage`` + ``build.json`` like a build from weights, so it runs on devices
the same way.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from decodebench.analysis.analyze import analyze_mlpackage
from decodebench.archives import ArchiveError, unpack_package
from decodebench.building.job import (
    BuildError,
    Job,
    StageClock,
    check_finite_decode,
    replace_directory,
)
from decodebench.contracts.build import BuildReport
from decodebench.contracts.names import PACKAGE_NAME, REPORT_NAME
from decodebench.contracts.presets import ModelConfig

VERIFY_STEPS = 4  # decode steps the folded package must match the uploaded one on


def package_from_zip(archive: Path, into: Path) -> Path:
    """Unpack a zipped package (``X.mlpackage/…`` or the package's contents at the top), by the
    rule of :mod:`decodebench.archives`; a refused archive is a :class:`BuildError`."""
    try:
        package = unpack_package(archive, into, archive.name)
    except ArchiveError as error:
        raise BuildError(str(error)) from None
    if package == into:  # the contents at the top: Core ML wants the folder named .mlpackage
        package = into.rename(into.with_suffix(".mlpackage"))
    return package


def _kv_positions(source: Path) -> set[int]:
    analysis = analyze_mlpackage(source)
    return {state.positions for state in analysis.states if state.positions}


def adopt_package(job: Job, source: Path, config: ModelConfig) -> BuildReport:
    """``source`` (an unpacked .mlpackage) as the build of ``job.variant`` in ``job.out_dir``; a
    package that cannot be read, analysed or driven by the interpreter is a :class:`BuildError`
    naming it and why (it must follow the decode interface the harness drives)."""
    from decodebench.analysis.analyze import AnalysisError
    from decodebench.formats.coreml.program import MilError

    if job.variant.package is None:
        raise BuildError("package: this variant names no package")
    try:
        return _adopt(job, source, config)
    except (AnalysisError, MilError) as error:
        raise BuildError(f"package {job.variant.package}: {error}") from None


def _adopt(job: Job, source: Path, config: ModelConfig) -> BuildReport:
    variant, clock, out_dir = job.variant, job.clock, job.out_dir
    (out_dir / REPORT_NAME).unlink(missing_ok=True)
    with clock.stage("analyse"):
        positions = _kv_positions(source)
    if positions and positions != {variant.context}:
        raise BuildError(
            f"context: the variant says {variant.context} but package {variant.package}'s KV "
            f"cache holds {', '.join(str(n) for n in sorted(positions))} positions"
        )
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".package-") as staging:
        staged = Path(staging) / PACKAGE_NAME
        if variant.fold:
            _fold_and_verify(source, staged, clock)
        else:
            shutil.copytree(source, staged)
        if not variant.allow_non_finite:  # else measured for its speed alone, as it is
            with clock.stage("check_finite"):
                check_finite_decode(staged)
        replace_directory(staged, out_dir / PACKAGE_NAME)
    with clock.stage("analyse"):
        analysis = analyze_mlpackage(out_dir / PACKAGE_NAME)
    return job.report(config, analysis)


def _fold_and_verify(source: Path, target: Path, clock: StageClock) -> None:
    from decodebench.formats.coreml.fold_package import fold_mlpackage
    from decodebench.formats.coreml.interpreter import NonFiniteError
    from decodebench.formats.coreml.program import MilError, quiet_coremltools
    from decodebench.formats.coreml.verify import verify_packages

    try:
        with clock.stage("fold"), quiet_coremltools():
            folded = fold_mlpackage(source, target)
        if not folded.changed:
            return  # copied byte for byte: nothing to verify
        with clock.stage("verify"), quiet_coremltools():
            result = verify_packages(source, target, VERIFY_STEPS)
    except NonFiniteError as error:
        raise BuildError(f"verify: the decode is not finite: {error}") from None
    except MilError as error:
        raise BuildError(f"fold: {error}") from None
    if result.non_finite is not None:
        raise BuildError(f"verify: the decode is not finite: {result.non_finite}")
    if not result.agree:
        raise BuildError(
            f"verify: the folded package differs from the uploaded one (max |Δlogit| "
            f"{result.max_abs_diff:.3g}, first divergent step {result.first_divergent_step})"
        )
