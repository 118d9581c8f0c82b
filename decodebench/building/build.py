"""Build one variant end to end: model -> sensitivity -> Core ML package -> analysis -> build.json.

:func:`build` is the one path of every build: it takes a :class:`~decodebench.building.sources.Source`
(where the model comes from: a preset, a checkpoint folder, a registry model, an upload, a
package made elsewhere), fetches it once, parses the recipe once, keys the build, answers it
from the cache or has the source make it, and writes the report. :func:`build_variant` is the
same for a model named locally (the CLI, the benchmarks, the tests).

The output directory holds ``model.mlpackage`` and ``build.json`` (a :class:`BuildReport`).
Both are replaced atomically, so a crashed build never leaves a half-written artifact behind
a valid-looking report. A build is keyed by (model identity, variant, toolchain): an identical
request is answered from ``out_dir`` itself or from the :class:`~decodebench.building.cache.BuildCache`.
With a cache, a model's sensitivity ranking is measured once and reused by its other variants
(:mod:`decodebench.building.ranking`).

The stages run one after the other. Overlapping the sensitivity (torch, GIL released in its
kernels) with tracing and conversion (pure Python) was measured and gained nothing: the
sensitivity's thousands of short kernels each wait for the GIL the converter holds.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from decodebench.building.cache import (
    PACKAGE_NAME,
    REPORT_NAME,
    BuildCache,
    find_build,
    request_key,
)
from decodebench.building.job import (
    BuildError,
    Job,
    ProgressCallback,
    StageClock,
    check_finite_decode,
    load_report,
    toolchain_versions,
    write_atomically,
)
from decodebench.building.sources import Source, local_source
from decodebench.contracts.build import BuildReport
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.recipes import parse_recipe

if TYPE_CHECKING:
    from decodebench.formats.coreml.convert import Converter

# What callers of the one build path also read from here.
__all__ = [
    "PACKAGE_NAME",
    "BuildError",
    "ProgressCallback",
    "build",
    "build_variant",
    "check_finite_decode",
    "load_report",
    "toolchain_versions",
]


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
    ``weights_fingerprint`` identifies ``weights`` when the caller knows its content already.
    """
    source = local_source(model, weights, weights_fingerprint)
    return build(source, variant, out_dir, progress, converter, cache)


def build(
    source: Source,
    variant: VariantSpec,
    out_dir: Path,
    progress: ProgressCallback | None = None,
    converter: Converter | None = None,
    cache: BuildCache | None = None,
) -> BuildReport:
    """The build of ``variant`` from ``source`` in ``out_dir``: fetched once, keyed, restored
    when it was built before, else made by the source; ``build.json`` written last."""
    started = time.perf_counter()
    created = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        return _build(source, variant, out_dir, started, progress, converter, cache)
    except BaseException:
        if created:  # a refused or failed build leaves no folder of its own behind
            shutil.rmtree(out_dir, ignore_errors=True)
        raise


def _build(
    source: Source,
    variant: VariantSpec,
    out_dir: Path,
    started: float,
    progress: ProgressCallback | None,
    converter: Converter | None,
    cache: BuildCache | None,
) -> BuildReport:
    recipe = parse_recipe(variant.quant)
    source.prepare()
    identity = source.identity((cache.root if cache else out_dir) / "fingerprints.json")
    toolchain = toolchain_versions(converter if source.converts else None, variant.format)
    key = request_key(identity, variant, toolchain)
    store = cache if source.cached else None
    found = find_build(out_dir, key, store)
    if found is not None:
        return found.model_copy(
            update={"cache_hit": True, "wall_seconds": round(time.perf_counter() - started, 3)}
        )
    job = Job(
        source.model, variant, recipe, identity, key, toolchain, out_dir, StageClock(progress),
        converter, cache,
    )  # fmt: skip
    report = source.make(job)
    if progress is not None:
        progress("done", 1.0)
    report.wall_seconds = round(time.perf_counter() - started, 3)
    write_atomically(out_dir / REPORT_NAME, report.model_dump_json(indent=2))
    if store is not None:
        store.store(key, out_dir)
    return report
