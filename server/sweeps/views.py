"""The JSON shape of a sweep, shared by the API and the pages."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from server.builds.views import build_view
from server.models import Run, Sweep
from server.sweeps.comparison import comparison
from server.sweeps.service import runs_of


def run_view(run: Run) -> dict[str, Any]:
    return {
        "id": run.id,
        "variant": run.variant.label,
        "device_class": run.device_class,
        "repetition": run.repetition,
        "order_key": run.order_key,
        "state": run.state,
        "attempts": run.attempts,
        "device_udid": run.device_udid,
        "simulated": run.simulated,
        "driver": run.driver,
        "failure_reason": run.failure_reason,
        "summary": run.summary,
    }


def sweep_overview(sweep: Sweep) -> dict[str, Any]:
    return {
        "id": sweep.id,
        "model": sweep.model,
        "state": sweep.state,
        "submitted_by": sweep.submitted_by,
        "created_at": sweep.created_at.isoformat(),
        "finished_at": sweep.finished_at.isoformat() if sweep.finished_at else None,
        "variants": [variant.label for variant in sweep.variants],
        "devices": sweep.spec["devices"],
    }


def sweep_detail(session: Session, sweep: Sweep) -> dict[str, Any]:
    runs = runs_of(session, sweep.id)
    table = comparison(session, sweep, runs)
    return {
        **sweep_overview(sweep),
        "spec": sweep.spec,
        "builds": [
            {**build_view(variant.build), "label": variant.label} for variant in sweep.variants
        ],
        "results": table,
        "simulated": any(row["simulated"] for row in table),
        "runs": [run_view(run) for run in runs],
    }
