"""What a nightly sweep ran on, and what changed between two nights."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from decodebench.contracts.results import PROTOCOL_VERSION
from decodebench.stats import summarize
from server.models import Agent, Run, RunState, Sweep
from server.sweeps.verdicts import measured_arms


def cell_key(variant: str, device_class: str) -> str:
    return f"{variant}@{device_class}"


def sweep_context(session: Session, sweep: Sweep) -> dict[str, Any]:
    """The build key's parts per variant, and per device class the harness, iOS versions and
    device UDIDs its succeeded runs used."""
    builds = {
        variant.label: {
            "build_id": variant.build_id,
            "key": variant.build.key,
            "model_identity": (variant.build.report or {}).get("model_identity", sweep.model),
            "recipe": variant.build.variant,
            "toolchain": variant.build.toolchain,
        }
        for variant in sweep.variants
    }
    devices: dict[str, dict[str, set[str]]] = {}
    runs = session.scalars(
        select(Run).where(Run.sweep_id == sweep.id, Run.state == RunState.succeeded)
    )
    for run in runs:
        seen = devices.setdefault(
            run.device_class, {"udids": set(), "ios_versions": set(), "agent_versions": set()}
        )
        seen["udids"].add(run.device_udid or "")
        seen["ios_versions"].add((run.summary or {}).get("os_version", ""))
        agent = session.get(Agent, run.agent_id) if run.agent_id else None
        seen["agent_versions"].add(agent.version if agent else "")
    return {
        "model": sweep.model,
        "builds": builds,
        "harness": {"protocol_version": PROTOCOL_VERSION},
        "devices": {
            device_class: {name: sorted(values) for name, values in seen.items()}
            for device_class, seen in sorted(devices.items())
        },
    }


def nightly_values(session: Session, sweep: Sweep) -> dict[str, dict[str, float]]:
    """Each (variant, device class)'s mean decode tok/s over every prompt of every run."""
    values = {}
    for arm in measured_arms(session, sweep):
        rates = [prompt.decode_tok_s for run in arm.runs for prompt in run.prompts]
        summary = summarize(rates)
        values[cell_key(arm.variant, arm.device_class)] = {
            "mean": summary.mean,
            "ci95_half_width": summary.ci95_half_width,
        }
    return values


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(value, dict):
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, inner in value.items():
        flat.update(_flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def what_changed(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """Every field that differs, e.g. builds.folded.toolchain.coremltools 9.0 -> 9.1."""
    old, new = _flatten(before), _flatten(after)
    return [
        {"field": field, "before": old.get(field), "after": new.get(field)}
        for field in sorted(old.keys() | new.keys())
        if old.get(field) != new.get(field)
    ]
