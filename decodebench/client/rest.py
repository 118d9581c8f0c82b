"""The REST client of the decodebench server, used by the CLI, CI jobs, agents and build
workers; leased work's calls are in decodebench/client/leased.py, claims over asyncio in
decodebench/client/claims.py."""

from __future__ import annotations

import hashlib
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from pydantic import TypeAdapter

from decodebench.client.base import API, KEEPALIVE_S, ApiError, answer, file_sha256
from decodebench.client.claims import AsyncClaims
from decodebench.client.leased import LeasedWork
from decodebench.contracts.api import (
    BuildDetail,
    DeviceView,
    ResultsStored,
    SweepDetail,
    SweepOverview,
    VerdictsView,
)
from decodebench.contracts.doctor_jobs import DoctorAssignment, DoctorJobView, DoctorOverview
from decodebench.contracts.domain import SweepSpec
from decodebench.contracts.protocol import (
    AgentRegistered,
    AgentRegistration,
    ClaimResponse,
    DeviceInfo,
    LeaseRenewal,
    ResultsBatchStored,
)
from decodebench.contracts.results import RunResult
from decodebench.contracts.schedules import (
    DeliveryResult,
    FiringView,
    ScheduleView,
    TickResult,
)
from decodebench.contracts.uploads import ModelView, UploadView
from decodebench.contracts.workers import BuildAssignment

_LIST_OF_SWEEPS = TypeAdapter(list[SweepOverview])
_LIST_OF_DEVICES = TypeAdapter(list[DeviceView])
_LIST_OF_SCHEDULES = TypeAdapter(list[ScheduleView])
_LIST_OF_MODELS = TypeAdapter(list[ModelView])
_LIST_OF_DOCTOR_JOBS = TypeAdapter(list[DoctorOverview])


class DecodebenchClient:
    def __init__(
        self, base_url: str, token: str, timeout: float = 30.0, max_connections: int = 100
    ) -> None:
        """``max_connections``: requests in flight at once (an agent's devices each upload and
        renew a lease besides the long-poll claims of `claims()`)."""
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self._timeout = timeout
        self._tls: ssl.SSLContext | None = None
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=self._headers,
            timeout=timeout,
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=max_connections,
                keepalive_expiry=KEEPALIVE_S,
            ),
        )
        # Leased work, one set of calls per kind (decodebench/client/leased.py).
        self.builds = LeasedWork(self._request, "builds", BuildAssignment)
        self.doctor_jobs = LeasedWork(self._request, "doctor", DoctorAssignment)

    def claims(self) -> AsyncClaims:
        """An asyncio client for claims, on the same server and token, with a connection of its
        own: an agent keeps one per batch of claims in flight (`agent/batching.py`), since a pool
        shared by hundreds of long polls spent most of the agent's CPU matching requests to
        connections. They share one TLS context (loading the CA certificates for each would cost
        more than the client)."""
        if self._tls is None:
            self._tls = httpx.create_ssl_context()
        return AsyncClaims(self.base_url, self._headers, self._timeout, self._tls)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> DecodebenchClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        return answer(self._http.request(method, API + path, **kwargs))

    # Users and CI

    def submit_sweep(self, spec: SweepSpec | dict[str, Any]) -> SweepDetail:
        body = spec.model_dump(mode="json") if isinstance(spec, SweepSpec) else spec
        return SweepDetail.model_validate(self._request("POST", "/sweeps", json=body))

    def get_sweep(self, sweep_id: int) -> SweepDetail:
        return SweepDetail.model_validate(self._request("GET", f"/sweeps/{sweep_id}"))

    def list_sweeps(self) -> list[SweepOverview]:
        return _LIST_OF_SWEEPS.validate_python(self._request("GET", "/sweeps"))

    def get_build(self, build_id: int) -> BuildDetail:
        return BuildDetail.model_validate(self._request("GET", f"/builds/{build_id}"))

    def get_verdicts(
        self, sweep_id: int, baseline_sweep: int | None = None, min_effect: float | None = None
    ) -> VerdictsView:
        params: dict[str, float | int] = {}
        if baseline_sweep is not None:
            params["baseline_sweep"] = baseline_sweep
        if min_effect is not None:
            params["min_effect"] = min_effect
        data = self._request("GET", f"/sweeps/{sweep_id}/verdicts", params=params)
        return VerdictsView.model_validate(data)

    def list_devices(self) -> list[DeviceView]:
        return _LIST_OF_DEVICES.validate_python(self._request("GET", "/devices"))

    # Agents

    def register_agent(self, registration: AgentRegistration) -> AgentRegistered:
        data = self._request("POST", "/agents/register", json=registration.model_dump(mode="json"))
        return AgentRegistered.model_validate(data)

    def heartbeat(self, devices: list[DeviceInfo]) -> None:
        payload = {"devices": [device.model_dump(mode="json") for device in devices]}
        self._request("POST", "/agents/heartbeat", json=payload)

    def claim_run(
        self, device_udid: str, claim_key: str | None = None, wait_seconds: int = 0
    ) -> ClaimResponse:
        """``claim_key``: send the same one again when retrying a claim whose answer was lost;
        ``wait_seconds``: long poll, answered as soon as a run is claimable."""
        body: dict[str, Any] = {"device_udid": device_udid}
        if claim_key is not None:
            body["claim_key"] = claim_key
        if wait_seconds:
            body["wait_seconds"] = wait_seconds
        return ClaimResponse.model_validate(self._request("POST", "/agents/claim", json=body))

    def renew_lease(self, run_id: int) -> LeaseRenewal:
        return LeaseRenewal.model_validate(self._request("POST", f"/runs/{run_id}/lease"))

    def upload_results(self, run_id: int, result: RunResult) -> ResultsStored:
        data = self._request("POST", f"/runs/{run_id}/results", json=result.model_dump(mode="json"))
        return ResultsStored.model_validate(data)

    def upload_many(self, uploads: Sequence[str]) -> ResultsBatchStored:
        """Several runs' results in one request; each of ``uploads`` is one run's upload as a
        JSON document, ``{"run_id": …, "result": {…}}`` (an agent's outbox entry as stored)."""
        content = '{"uploads":[' + ",".join(uploads) + "]}"
        data = self._request(
            "POST",
            "/agents/results",
            content=content.encode(),
            headers={"Content-Type": "application/json"},
        )
        return ResultsBatchStored.model_validate(data)

    def fail_run(self, run_id: int, reason: str, retryable: bool = True) -> None:
        self._request(
            "POST", f"/runs/{run_id}/fail", json={"reason": reason, "retryable": retryable}
        )

    def download_artifact(self, sha256: str, destination: Path) -> Path:
        """Stream an artifact to `destination`, checking it against its content address."""
        digest = hashlib.sha256()
        partial = destination.with_name(destination.name + ".partial")
        with self._http.stream("GET", f"{API}/artifacts/{sha256}") as response:
            if response.status_code >= 400:
                response.read()
                raise ApiError(response.status_code, response.text)
            with partial.open("wb") as out:
                for chunk in response.iter_bytes():
                    digest.update(chunk)
                    out.write(chunk)
        if digest.hexdigest() != sha256:
            partial.unlink(missing_ok=True)
            raise ApiError(502, f"artifact {sha256} arrived with digest {digest.hexdigest()}")
        partial.replace(destination)
        return destination

    # Build workers (the leased calls: `builds`, `doctor_jobs`)

    def upload_artifact(self, path: Path) -> str:
        sha256 = file_sha256(path)
        with path.open("rb") as body:
            self._request(
                "PUT",
                f"/artifacts/{sha256}",
                content=body,
                headers={"Content-Type": "application/octet-stream"},
            )
        return sha256

    # Uploads and models users bring (decodebench.uploading drives a whole upload)

    def create_upload(self, filename: str, size: int) -> UploadView:
        data = self._request("POST", "/uploads", json={"filename": filename, "size": size})
        return UploadView.model_validate(data)

    def get_upload(self, upload_id: str) -> UploadView:
        return UploadView.model_validate(self._request("GET", f"/uploads/{upload_id}"))

    def put_upload_chunk(self, upload_id: str, offset: int, data: bytes) -> UploadView:
        answer = self._request(
            "PUT",
            f"/uploads/{upload_id}",
            params={"offset": offset},
            content=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        return UploadView.model_validate(answer)

    def finish_upload(self, upload_id: str, sha256: str) -> UploadView:
        data = self._request("POST", f"/uploads/{upload_id}/finish", json={"sha256": sha256})
        return UploadView.model_validate(data)

    def register_model(self, registration: dict[str, Any]) -> ModelView:
        return ModelView.model_validate(self._request("POST", "/models", json=registration))

    def list_models(self) -> list[ModelView]:
        return _LIST_OF_MODELS.validate_python(self._request("GET", "/models"))

    def get_model(self, name: str) -> ModelView:
        return ModelView.model_validate(self._request("GET", f"/models/{name}"))

    # Doctor jobs (users)

    def submit_doctor(self, request: dict[str, Any]) -> DoctorJobView:
        return DoctorJobView.model_validate(self._request("POST", "/doctor", json=request))

    def get_doctor(self, job_id: int) -> DoctorJobView:
        return DoctorJobView.model_validate(self._request("GET", f"/doctor/{job_id}"))

    def list_doctor(self) -> list[DoctorOverview]:
        return _LIST_OF_DOCTOR_JOBS.validate_python(self._request("GET", "/doctor"))

    def download_repaired(self, job_id: int, destination: Path) -> Path:
        """The repaired package's zip of a done job."""
        partial = destination.with_name(destination.name + ".partial")
        with self._http.stream("GET", f"{API}/doctor/{job_id}/package") as response:
            if response.status_code >= 400:
                response.read()
                answer(response)
            with partial.open("wb") as out:
                for chunk in response.iter_bytes():
                    out.write(chunk)
        partial.replace(destination)
        return destination

    # Nightly schedules

    def create_schedule(self, request: dict[str, Any]) -> ScheduleView:
        return ScheduleView.model_validate(self._request("POST", "/schedules", json=request))

    def list_schedules(self) -> list[ScheduleView]:
        return _LIST_OF_SCHEDULES.validate_python(self._request("GET", "/schedules"))

    def set_schedule_paused(self, schedule_id: int, paused: bool) -> ScheduleView:
        action = "pause" if paused else "resume"
        return ScheduleView.model_validate(
            self._request("POST", f"/schedules/{schedule_id}/{action}")
        )

    def run_schedule_now(self, schedule_id: int) -> FiringView:
        return FiringView.model_validate(
            self._request("POST", f"/schedules/{schedule_id}/run-now", json={})
        )

    def tick_schedules(self) -> TickResult:
        return TickResult.model_validate(self._request("POST", "/schedules/tick", json={}))

    def deliver_webhooks(self) -> DeliveryResult:
        return DeliveryResult.model_validate(self._request("POST", "/schedules/webhooks/deliver"))
