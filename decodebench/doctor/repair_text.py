"""The text report of a repair (``decodebench repair`` and the doctor print it)."""

from __future__ import annotations

from decodebench.contracts.doctor import RepairReport


def render(report: RepairReport) -> str:
    lines = [f"repair {report.source} -> {report.target}"]
    rewritten = [norm for norm in report.norms if norm.status == "rewritten"]
    left = [norm for norm in report.norms if norm.status != "rewritten"]
    lines.append(
        f"  norms          {len(report.norms)} found, {len(rewritten)} rewritten overflow-safe, "
        f"{len(left)} left"
    )
    kinds = sorted({norm.kind for norm in rewritten})
    if rewritten:
        labels = ", ".join(norm.label for norm in rewritten[:4])
        more = f" and {len(rewritten) - 4} more" if len(rewritten) > 4 else ""
        lines.append(f"    rewritten    ({'/'.join(kinds)}) {labels}{more}")
    for norm in left:
        lines.append(f"    left         {norm.label}: {norm.reason}")
    if report.fold is not None:
        lines.append(
            f"  fold           {report.fold.found} attention patterns, "
            f"{report.fold.rewritten} foldable, {report.fold.refused} refused"
        )
    lines.append(
        f"  proof          against the package's own fp32 run, {report.prompts} prompts x "
        f"{report.steps} greedy steps"
        + (
            f", each prompt through its {report.prefill_function!r} function, then "
            f"{report.decode_function!r}"
            if report.prefill_function is not None
            else ""
        )
    )
    for agreement in [report.original, *report.candidates]:
        lines.append(f"    {agreement.candidate:12} {agreement.summary()}")
        if agreement.candidate != "original" and agreement.non_finite < len(agreement.prompts):
            lines += [f"      {line}" for line in agreement.divergences()]
    lines.append(f"  applied        {', '.join(report.applied) or 'nothing'}")
    for name, why in report.refused.items():
        lines.append(f"  not applied    {name}: {why}")
    return "\n".join(lines)
