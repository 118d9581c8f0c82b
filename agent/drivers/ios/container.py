"""The harness app's Documents directory, over house_arrest/AFC (see decodebench.harness).

Plain async functions on an open `HouseArrestService` (vended with VendDocuments), so the
driver only decides *when*; what goes where on the phone is here.
"""

from __future__ import annotations

import json
from pathlib import Path

from pymobiledevice3.services.house_arrest import HouseArrestService

from agent.artifacts import directory_bytes
from agent.drivers.base import DriverError
from decodebench.harness import (
    COMPLETE_MARKER,
    DONE_MARKER,
    HARNESS_LOG,
    JOB_FILE,
    MODELS_DIR,
    PARTIAL_SUFFIX,
    RESULTS_FILE,
    DoneMarker,
    HarnessJob,
    artifact_name,
    model_dir,
    package_engine,
    results_digest,
)

DOCUMENTS = "/Documents"
WRITE_CHUNK = 4 * 2**20


def documents_path(name: str) -> str:
    return f"{DOCUMENTS}/{name}"


async def push_package(
    afc: HouseArrestService, sha256: str, package: Path, keep: set[str]
) -> int | None:
    """Push a package once: bytes pushed, or None when it was already complete on the phone.

    Other models are removed unless in `keep` (a small cache for A B B A interleaving); so is
    any push cut short (it has no `complete` marker, written last).
    """
    remote = documents_path(model_dir(sha256))
    if await afc.exists(f"{remote}/{COMPLETE_MARKER}"):
        return None
    models = documents_path(MODELS_DIR)
    if await afc.exists(models):
        for name in await afc.listdir(models):
            if name not in keep:
                await afc.rm(f"{models}/{name}", force=True)
    # The name the job's package_path gives it: model.mlpackage, or model.aimodel for Core AI.
    target = f"{remote}/{artifact_name(package_engine(package.name))}"
    await afc.makedirs(target)
    for path in sorted(package.rglob("*")):
        destination = f"{target}/{path.relative_to(package).as_posix()}"
        if path.is_dir():
            await afc.makedirs(destination)
            continue
        handle = await afc.fopen(destination, "w")
        try:
            with path.open("rb") as stream:
                while chunk := stream.read(WRITE_CHUNK):
                    await afc.fwrite(handle, chunk)
        finally:
            await afc.fclose(handle)
    pushed = directory_bytes(package)
    marker = {"artifact_sha256": sha256, "bytes": pushed}
    await afc.set_file_contents(f"{remote}/{COMPLETE_MARKER}", json.dumps(marker).encode())
    return pushed


async def push_job(afc: HouseArrestService, job: HarnessJob) -> None:
    """job.json, after removing what the previous run left (results, marker, log)."""
    for name in (RESULTS_FILE, DONE_MARKER, HARNESS_LOG, JOB_FILE):
        for variant in (name, name + PARTIAL_SUFFIX):
            await afc.rm_single(documents_path(variant), force=True)
    await afc.set_file_contents(documents_path(JOB_FILE), job.model_dump_json().encode())


async def is_done(afc: HouseArrestService) -> bool:
    return bool(await afc.exists(documents_path(DONE_MARKER)))


async def read_results(afc: HouseArrestService, run_id: int) -> bytes:
    """results.json of run `run_id`, checked against the done marker's digest."""
    marker = DoneMarker.model_validate_json(
        await afc.get_file_contents(documents_path(DONE_MARKER))
    )
    if marker.run_id != run_id:
        raise DriverError(f"the done marker is from run {marker.run_id}, not run {run_id}")
    if not marker.ok:
        raise DriverError(f"the harness failed: {marker.error}")
    data = bytes(await afc.get_file_contents(documents_path(RESULTS_FILE)))
    if results_digest(data) != marker.results_sha256:
        raise DriverError(f"{RESULTS_FILE} does not match the digest in the done marker")
    return data


async def read_harness_log(afc: HouseArrestService) -> str:
    if not await afc.exists(documents_path(HARNESS_LOG)):
        return ""
    return bytes(await afc.get_file_contents(documents_path(HARNESS_LOG))).decode(errors="replace")
