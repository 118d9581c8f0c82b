"""The calls of leased work, the same for every kind a build worker holds under a lease: read
the assignment, start (and get the lease), report progress, renew, complete, fail, reconcile.
A kind is its URL prefix and its assignment's contract (``DecodebenchClient.builds``,
``DecodebenchClient.doctor_jobs``)."""

from __future__ import annotations

from typing import Generic, TypeVar

from decodebench.client.base import Request
from decodebench.contracts.api import Reenqueued
from decodebench.contracts.base import Contract
from decodebench.contracts.leases import MAX_STAGE, LeaseFailure, LeaseProgress, LeaseStart

A = TypeVar("A", bound=Contract)


class LeasedWork(Generic[A]):
    """``/{prefix}/{id}/…`` for one leased kind; ``assignment`` is what a worker is given."""

    def __init__(self, request: Request, prefix: str, assignment: type[A]) -> None:
        self._request = request
        self.prefix = prefix
        self._assignment = assignment

    def assignment(self, work_id: int) -> A:
        data = self._request("GET", f"/{self.prefix}/{work_id}/assignment")
        return self._assignment.model_validate(data)

    def start(self, work_id: int, worker: str) -> LeaseStart:
        data = self._request("POST", f"/{self.prefix}/{work_id}/start", json={"worker": worker})
        return LeaseStart.model_validate(data)

    def progress(self, work_id: int, lease: str, stage: str, fraction: float) -> None:
        """Renews the lease too."""
        body = LeaseProgress(lease=lease, stage=stage[:MAX_STAGE], fraction=fraction)
        self._post(work_id, "progress", body)

    def renew(self, work_id: int, lease: str) -> None:
        self._request("POST", f"/{self.prefix}/{work_id}/lease", json={"lease": lease})

    def complete(self, work_id: int, outcome: Contract) -> None:
        """``outcome``: the kind's own (it carries the lease)."""
        self._post(work_id, "complete", outcome)

    def fail(self, work_id: int, lease: str, reason: str) -> None:
        self._post(work_id, "fail", LeaseFailure(lease=lease, reason=reason[:4000]))

    def reconcile(self) -> list[int]:
        """Queue again the kind's work whose worker was lost (or whose message was)."""
        data = self._request("POST", f"/{self.prefix}/reconcile")
        return Reenqueued.model_validate(data).reenqueued

    def _post(self, work_id: int, action: str, body: Contract) -> None:
        path = f"/{self.prefix}/{work_id}/{action}"
        self._request("POST", path, json=body.model_dump(mode="json"))
