"""Compare the graph analyses of two builds: what changed, and how much faster it should decode.

The speed-up is B over A (``> 1``: B decodes faster). ``bytes_speedup`` follows from the byte
counts alone (``total_A / total_B``); ``predicted`` applies each device profile, which adds the
per-op dispatch term.

Redundant copies are matched between the two graphs, not by name (names differ between
builds), but by what they copy: kind, op, shape, dtype and source first, then, for copies left
over, without the source. What remains on one side only is the redundant difference.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict

from decodebench.contracts.analysis import GraphAnalysis, RedundantCopy
from decodebench.contracts.profiles import DEVICE_PROFILES, DeviceProfile

CATEGORIES = ("weights", "kv_read", "kv_write", "redundant", "total")
MIB = 1024**2


class Change(BaseModel):
    model_config = ConfigDict(frozen=True)

    a: int
    b: int
    delta: int

    @classmethod
    def of(cls, a: int, b: int) -> Change:
        return cls(a=a, b=b, delta=b - a)


class OpChange(BaseModel):
    model_config = ConfigDict(frozen=True)

    op: str
    a: int
    b: int
    delta: int


class PredictedChange(BaseModel):
    model_config = ConfigDict(frozen=True)

    a: float
    b: float
    speedup: float


class GraphDiff(BaseModel):
    model_config = ConfigDict(frozen=True)

    a: str
    b: str
    ops_total: Change
    dispatch_ops: Change
    op_changes: list[OpChange]
    bytes_per_token: dict[str, Change]
    weight_bytes: Change
    kv_read_per_position: Change
    kv_positions: Change
    state_write_ops: Change
    state_write_bytes: Change
    redundant_only_in_a: list[RedundantCopy]
    redundant_only_in_b: list[RedundantCopy]
    redundant_removed_bytes: int  # tensor bytes of the copies only A makes
    redundant_added_bytes: int
    bytes_speedup: float
    predicted: dict[str, PredictedChange]

    @property
    def added_ops(self) -> list[OpChange]:
        return [change for change in self.op_changes if change.delta > 0]

    @property
    def removed_ops(self) -> list[OpChange]:
        return [change for change in self.op_changes if change.delta < 0]


def _unmatched(
    left: Sequence[RedundantCopy], right: Sequence[RedundantCopy]
) -> tuple[list[RedundantCopy], list[RedundantCopy]]:
    """The copies of each side with no counterpart on the other, in program order."""

    def full_key(copy: RedundantCopy) -> tuple[object, ...]:
        return (copy.kind, copy.op, tuple(copy.shape), copy.dtype, copy.source_op, copy.source)

    def loose_key(copy: RedundantCopy) -> tuple[object, ...]:
        return (copy.kind, copy.op, tuple(copy.shape), copy.dtype)

    left_left, right_left = list(left), list(right)
    for key in (full_key, loose_key):
        pool: dict[tuple[object, ...], list[int]] = defaultdict(list)
        for index, copy in enumerate(right_left):
            pool[key(copy)].append(index)
        matched_right: set[int] = set()
        remaining_left = []
        for copy in left_left:
            candidates = pool.get(key(copy))
            if candidates:
                matched_right.add(candidates.pop(0))
            else:
                remaining_left.append(copy)
        left_left = remaining_left
        right_left = [copy for index, copy in enumerate(right_left) if index not in matched_right]
    return left_left, right_left


def diff_analyses(
    a: GraphAnalysis,
    b: GraphAnalysis,
    *,
    labels: tuple[str, str] = ("A", "B"),
    profiles: Iterable[DeviceProfile] | None = None,
) -> GraphDiff:
    chosen = list(DEVICE_PROFILES.values() if profiles is None else profiles)
    op_types = sorted(set(a.op_counts) | set(b.op_counts))
    op_changes = [
        OpChange(op=op, a=a.op_counts.get(op, 0), b=b.op_counts.get(op, 0), delta=delta)
        for op in op_types
        if (delta := b.op_counts.get(op, 0) - a.op_counts.get(op, 0))
    ]
    op_changes.sort(key=lambda change: (-abs(change.delta), change.op))
    only_a, only_b = _unmatched(a.redundant_ops, b.redundant_ops)
    moved_a, moved_b = a.bytes_per_token, b.bytes_per_token
    predicted = {}
    if moved_a.total > 0 and moved_b.total > 0:
        for profile in chosen:
            rate_a, rate_b = a.predict(profile), b.predict(profile)
            predicted[profile.device_class] = PredictedChange(
                a=rate_a, b=rate_b, speedup=rate_b / rate_a
            )
    return GraphDiff(
        a=labels[0],
        b=labels[1],
        ops_total=Change.of(a.ops_total, b.ops_total),
        dispatch_ops=Change.of(a.dispatch_ops, b.dispatch_ops),
        op_changes=op_changes,
        bytes_per_token={
            category: Change.of(getattr(moved_a, category), getattr(moved_b, category))
            for category in CATEGORIES
        },
        weight_bytes=Change.of(a.weight_bytes, b.weight_bytes),
        kv_read_per_position=Change.of(moved_a.kv_read_per_position, moved_b.kv_read_per_position),
        kv_positions=Change.of(moved_a.kv_positions, moved_b.kv_positions),
        state_write_ops=Change.of(a.state_write_ops, b.state_write_ops),
        state_write_bytes=Change.of(a.state_write_bytes, b.state_write_bytes),
        redundant_only_in_a=only_a,
        redundant_only_in_b=only_b,
        redundant_removed_bytes=sum(copy.bytes for copy in only_a),
        redundant_added_bytes=sum(copy.bytes for copy in only_b),
        bytes_speedup=moved_a.total / moved_b.total if moved_b.total else 0.0,
        predicted=predicted,
    )


def _mib(size: int) -> str:
    return f"{size / MIB:,.2f}"


def _copies_summary(copies: Sequence[RedundantCopy]) -> list[str]:
    """One line per (kind, shape, source op) group: a 60-tile list reads as one line."""
    groups: dict[tuple[str, str, tuple[int, ...], str], list[RedundantCopy]] = defaultdict(list)
    for copy in copies:
        groups[(copy.kind, copy.op, tuple(copy.shape), copy.source_op)].append(copy)
    lines = []
    for (kind, op, shape, source_op), members in groups.items():
        sources = ", ".join(member.source for member in members[:3])
        more = f", … ({len(members)} in all)" if len(members) > 3 else ""
        lines.append(
            f"    {len(members):4d} × {kind:13s} {op} {list(shape)} {members[0].dtype}: "
            f"{_mib(sum(member.bytes for member in members))} MiB, from {source_op} "
            f"({sources}{more})"
        )
    return lines


def render_diff(diff: GraphDiff) -> str:
    width = 16
    lines = [f"A = {diff.a}", f"B = {diff.b}", ""]
    header = f"  {'bytes per token':18s} {'A (MiB)':>{width}s} {'B (MiB)':>{width}s} {'B - A (MiB)':>14s}"
    lines += [header, "  " + "-" * (len(header) - 2)]
    for category, change in diff.bytes_per_token.items():
        lines.append(
            f"  {category:18s} {_mib(change.a):>{width}s} {_mib(change.b):>{width}s} "
            f"{_mib(change.delta):>14s}"
        )
    positions = diff.kv_positions
    lines.append(
        f"  kv_read is at full context ({positions.a} / {positions.b} positions); reading only "
        f"positions 0..p would take {diff.kv_read_per_position.a:,} / "
        f"{diff.kv_read_per_position.b:,} bytes per position"
    )
    lines.append("")
    for title, change in (
        ("ops", diff.ops_total),
        ("dispatched ops", diff.dispatch_ops),
        ("state-write ops", diff.state_write_ops),
        ("weight bytes", diff.weight_bytes),
    ):
        lines.append(
            f"  {title:18s} {change.a:>{width},d} {change.b:>{width},d} {change.delta:>+14,d}"
        )
    if diff.added_ops or diff.removed_ops:
        lines.append("")
        for label, changes in (
            ("ops added in B", diff.added_ops),
            ("ops removed in B", diff.removed_ops),
        ):
            if changes:
                listed = ", ".join(f"{change.op} {change.delta:+d}" for change in changes)
                lines.append(f"  {label:18s} {listed}")
    for label, copies, total in (
        ("redundant copies only in A", diff.redundant_only_in_a, diff.redundant_removed_bytes),
        ("redundant copies only in B", diff.redundant_only_in_b, diff.redundant_added_bytes),
    ):
        lines.append("")
        lines.append(
            f"  {label}: {len(copies)} ops, {_mib(total)} MiB of tensors "
            f"({_mib(2 * total)} MiB moved per token, written and read again)"
        )
        lines += _copies_summary(copies)
    lines.append("")
    lines.append(f"  speed-up from bytes alone (A total / B total): {diff.bytes_speedup:.3f}x")
    for device_class, prediction in diff.predicted.items():
        lines.append(
            f"  predicted {device_class:16s} {prediction.a:8.2f} -> {prediction.b:8.2f} tok/s "
            f"({prediction.speedup:.3f}x)"
        )
    return "\n".join(lines)
