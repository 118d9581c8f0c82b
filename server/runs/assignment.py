"""What an agent receives when it claims a run."""

from __future__ import annotations

from sqlalchemy.orm import Session

from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.protocol import RunAssignment
from server.builds.views import report_of
from server.config import Settings
from server.models import Build, Run, Sweep


def assignment_for(session: Session, run: Run, settings: Settings) -> RunAssignment:
    build = session.get(Build, run.build_id)
    sweep = session.get(Sweep, run.sweep_id)
    assert build is not None and sweep is not None
    report = report_of(build)
    assert report is not None
    assert build.artifact_sha256 is not None and run.lease_expires_at is not None
    return RunAssignment(
        run_id=run.id,
        sweep_id=sweep.id,
        build_id=build.id,
        model=build.model,
        variant=VariantSpec.model_validate(run.variant.variant),
        variant_label=run.variant.label,
        device_class=run.device_class,
        prompts=int(sweep.spec["prompts"]),
        decode_tokens=int(sweep.spec["decode_tokens"]),
        artifact_sha256=build.artifact_sha256,
        artifact_url=f"{settings.public_url}/api/v1/artifacts/{build.artifact_sha256}",
        bytes_per_token=report.analysis.bytes_per_token.total,
        lease_expires_at=run.lease_expires_at.isoformat(),
        lease_seconds=settings.lease_seconds,
    )
