"""Parsing `INDEX=SPEC` emulated-device faults (kept free of heavy imports for settings)."""

from __future__ import annotations

from collections.abc import Sequence

from emulator.faults import Condition, FaultPlan, apply_spec


def parse_fault_specs(specs: Sequence[str], device_count: int) -> dict[int, tuple[str, ...]]:
    """`INDEX=SPEC` items (e.g. `0=disconnect-mid-push`, `1=thermal=serious`) by device index."""
    faults: dict[int, list[str]] = {}
    for item in specs:
        index_text, separator, spec = item.partition("=")
        if not separator or not index_text.strip().isdigit():
            raise ValueError(f"fault {item!r} must look like INDEX=SPEC, e.g. 0=app-crash")
        index = int(index_text)
        if index >= device_count:
            raise ValueError(f"fault {item!r} names device {index}, but there are {device_count}")
        faults.setdefault(index, []).append(spec)
    return {index: tuple(items) for index, items in faults.items()}


def check_fault_specs(specs: Sequence[str], device_count: int) -> None:
    """Raise ValueError naming the first spec that would not apply."""
    for specs_of_device in parse_fault_specs(specs, device_count).values():
        for spec in specs_of_device:
            apply_spec(spec, Condition(), FaultPlan())
