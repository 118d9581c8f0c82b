"""Fold a saved ``.mlpackage`` into a new one, and report what changed (patterns, ops, bytes)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from decodebench.analysis.analyze import analyze_mlpackage
from decodebench.contracts.analysis import GraphAnalysis
from decodebench.contracts.doctor import FoldReport
from decodebench.formats.coreml.fold import fold_program
from decodebench.formats.coreml.program import MilError, load_package, save_package

MIB = 1024**2
FOLD_METADATA_KEY = "decodebench.fold_gqa"


class FoldPackageReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    source: str
    target: str
    fold: FoldReport
    before: GraphAnalysis
    after: GraphAnalysis

    @property
    def changed(self) -> bool:
        return self.fold.rewritten > 0


def fold_mlpackage(source: Path | str, target: Path | str) -> FoldPackageReport:
    """Write ``source`` with its provable GQA patterns folded to ``target``.

    When nothing can be rewritten the package is copied unchanged, byte for byte.
    """
    source, target = Path(source), Path(target)
    if source.resolve() == target.resolve():
        raise MilError("the output package must differ from the input package")
    package = load_package(source)
    report = fold_program(package.program)
    if report.rewritten:
        summary = f"{report.rewritten} of {report.found} attention patterns folded"
        save_package(package.program, target, package.spec, {FOLD_METADATA_KEY: summary})
    else:
        copy_package(source, target)
    return FoldPackageReport(
        source=str(source),
        target=str(target),
        fold=report,
        before=analyze_mlpackage(source),
        after=analyze_mlpackage(target),
    )


def copy_package(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".saving-") as staging:
        staged = Path(staging) / target.name
        shutil.copytree(source, staged)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staged, target)


def render(report: FoldPackageReport) -> str:
    fold, before, after = report.fold, report.before, report.after
    lines = [
        f"fold {report.source} -> {report.target}",
        f"  patterns       {fold.found} found, {fold.rewritten} rewritten, {fold.refused} refused",
    ]
    for pattern in fold.patterns:
        where = f"{pattern.function}/{pattern.score_op}"
        if pattern.status == "rewritten":
            lines.append(
                f"  [rewritten] {where}: {pattern.query_heads} query heads over "
                f"{pattern.kv_heads} KV heads ({pattern.head_mapping}), "
                f"{pattern.query_length} query position(s), "
                f"{pattern.replicated_bytes / MIB:.2f} MiB of replicated K/V no longer produced"
            )
        else:
            lines.append(f"  [refused]   {where}: {'; '.join(pattern.reasons)}")
    for stray in fold.stray_replications:
        lines.append(f"  [untouched] {stray}: replicated K/V outside an attention pattern")
    for alignment in fold.mask_alignments:
        lines.append(f"  [mask]      {alignment}")
    moved_before, moved_after = before.bytes_per_token.total, after.bytes_per_token.total
    change = (moved_after - moved_before) / moved_before * 100 if moved_before else 0.0
    lines += [
        f"  ops            {before.ops_total} -> {after.ops_total} "
        f"({before.non_const_ops} -> {after.non_const_ops} non-const)",
        f"  tile ops       {before.tile_ops} ({before.tile_output_bytes / MIB:.1f} MiB) -> "
        f"{after.tile_ops} ({after.tile_output_bytes / MIB:.1f} MiB)",
        f"  copies         {len(before.redundant_ops)} ({before.redundant_output_bytes / MIB:.1f} MiB)"
        f" -> {len(after.redundant_ops)} ({after.redundant_output_bytes / MIB:.1f} MiB)"
        " redundant copies found by the analysis",
        f"  bytes/token    {moved_before:,} -> {moved_after:,} ({change:+.1f}%)",
    ]
    before_tok_s, after_tok_s = before.predicted_tok_s(), after.predicted_tok_s()
    for device, rate in before_tok_s.items():
        lines.append(f"  predicted      {device}: {rate:.1f} -> {after_tok_s[device]:.1f} tok/s")
    changed_types = sorted(set(before.op_counts) | set(after.op_counts))
    deltas = [
        f"{op_type} {before.op_counts.get(op_type, 0)}->{after.op_counts.get(op_type, 0)}"
        for op_type in changed_types
        if before.op_counts.get(op_type, 0) != after.op_counts.get(op_type, 0)
    ]
    if deltas:
        lines.append(f"  op changes     {', '.join(deltas)}")
    return "\n".join(lines)
