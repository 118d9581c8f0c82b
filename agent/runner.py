"""Execute one claimed run on one device: fetch, drive the device, upload, or report why not.

`RunExecutor.execute` never raises for a run's own failure: every exception becomes a
`fail_run` reason (with whether a retry elsewhere could help), so a device thread survives any
single bad run. Only a lost lease is not reported: the run belongs to someone else by then.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from dataclasses import dataclass

import httpx
from pydantic import ValidationError

from agent.artifacts import ArtifactCache
from agent.drivers.base import (
    ArtifactError,
    Cancellation,
    DeviceDriver,
    DriverError,
    HarnessJob,
    HarnessPrompt,
    RunCancelled,
    run_on_device,
)
from agent.outbox import BatchedUploads, Outbox
from decodebench.client import ApiError, DecodebenchClient
from decodebench.contracts.names import DeviceStatus
from decodebench.contracts.presets import get_model
from decodebench.contracts.profiles import DEVICE_PROFILES
from decodebench.contracts.protocol import DeviceInfo, RunAssignment
from decodebench.contracts.results import RunResult
from decodebench.prompts import PROMPT_SET_VERSION, builtin_prompts, pseudo_tokenize

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 2000
DEVICE_LOG_TAIL_CHARS = 600


class JobError(ValueError):
    """The assignment cannot be turned into a harness job (a server-side or spec problem)."""


class ResultMismatch(ValueError):
    """The harness's results.json does not answer the job it was given."""


@dataclass(frozen=True)
class RunOutcome:
    run_id: int
    completed: bool
    reason: str = ""
    result: RunResult | None = None
    device_status: DeviceStatus | None = (
        None  # what a device failure says about the device (locked …)
    )


def build_job(assignment: RunAssignment, device: DeviceInfo | None = None) -> HarnessJob:
    """Prompts as token ids, left-truncated so prompt plus decoded tokens fit the context."""
    try:
        vocab_size = assignment.vocab_size or get_model(assignment.model).vocab_size
        token_ids = prompt_ids(assignment, vocab_size)
    except (KeyError, ValueError) as error:
        raise JobError(str(error).strip("'\"")) from error
    context = assignment.variant.context
    room = context - assignment.decode_tokens
    if room < 1:
        raise JobError(
            f"decode_tokens {assignment.decode_tokens} leaves no room for a prompt in a "
            f"{context}-token context"
        )
    return HarnessJob(
        run_id=assignment.run_id,
        model=assignment.model,
        variant_label=assignment.variant_label,
        device_class=assignment.device_class,
        device_udid=device.udid if device is not None else "",
        driver=device.driver if device is not None else "",
        artifact_sha256=assignment.artifact_sha256,
        engine=assignment.variant.format.value,
        bytes_per_token=assignment.bytes_per_token,
        context_tokens=context,
        decode_tokens=assignment.decode_tokens,
        prompt_set_version=assignment.prompt_set_version or PROMPT_SET_VERSION,
        variant=assignment.variant,
        prompts=[
            HarnessPrompt(index=index, token_ids=ids[-room:]) for index, ids in enumerate(token_ids)
        ],
    )


def prompt_ids(assignment: RunAssignment, vocab_size: int) -> list[list[int]]:
    """The token ids the assignment carries (a model's own tokenizer), else pseudo-tokens of the
    sweep's texts or of the built-in set."""
    if assignment.prompt_token_ids is not None:
        ids = assignment.prompt_token_ids
        if len(ids) != assignment.prompts or not all(ids):
            raise ValueError(f"the assignment carries {len(ids)} prompts for {assignment.prompts}")
        if any(not 0 <= token < vocab_size for prompt in ids for token in prompt):
            raise ValueError(f"a prompt token id is outside the vocabulary of {vocab_size}")
        return ids
    if assignment.prompt_texts is not None:
        return [pseudo_tokenize(text, vocab_size) or [0] for text in assignment.prompt_texts]
    return [prompt.token_ids(vocab_size) for prompt in builtin_prompts(assignment.prompts)]


def check_engine(driver: DeviceDriver, job: HarnessJob) -> None:
    """A driver that decodes only some formats (``engines``) refuses a job of another by name,
    before its artifact is fetched."""
    engines = getattr(driver, "engines", None)
    if engines is not None and job.engine not in engines:
        raise JobError(
            f"the {driver.name} driver decodes {' and '.join(engines)} packages only; this run's "
            f"variant {job.variant_label} is in format {job.engine}"
        )


def check_result(job: HarnessJob, device: DeviceInfo, result: RunResult) -> None:
    if result.device_udid != device.udid or result.device_class != device.device_class:
        raise ResultMismatch(
            f"results.json is from {result.device_class} {result.device_udid}, "
            f"expected {device.device_class} {device.udid}"
        )
    expected = {prompt.index: len(prompt.token_ids) for prompt in job.prompts}
    answered = {prompt.prompt_index: prompt for prompt in result.prompts}
    if set(answered) != set(expected):
        raise ResultMismatch(
            f"results.json answers prompts {sorted(answered)}, the job asked for {sorted(expected)}"
        )
    for index, prompt in sorted(answered.items()):
        if prompt.prompt_tokens != expected[index]:
            raise ResultMismatch(
                f"prompt {index}: results.json reports {prompt.prompt_tokens} prompt tokens, "
                f"the job pushed {expected[index]}"
            )
        if prompt.generated_tokens != job.decode_tokens:
            raise ResultMismatch(
                f"prompt {index}: {prompt.generated_tokens} tokens generated, "
                f"the job asked for {job.decode_tokens}"
            )


def failure_reason(error: BaseException, step: str) -> tuple[str, bool]:
    """A run failure's reason for humans, and whether retrying (elsewhere) could succeed."""
    if isinstance(error, RunCancelled):
        return error.reason, True
    if isinstance(error, ArtifactError):
        # The download matched its sha256, so these bytes are what the build produced.
        return f"unusable artifact: {error}", False
    if isinstance(error, DriverError):
        reason = f"device error while {step}: {error}"
        if error.device_log:
            reason += f" | device log: {error.device_log[-DEVICE_LOG_TAIL_CHARS:]}"
        return reason, True
    if isinstance(error, JobError):
        return f"cannot run this assignment: {error}", False
    if isinstance(error, ResultMismatch):
        return f"harness results do not match the job: {error}", False
    if isinstance(error, ValidationError):
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}"
            for item in error.errors()[:5]
        )
        return f"invalid harness results while {step}: {problems}", False
    if isinstance(error, ApiError):
        return f"server answered HTTP {error.status_code} while {step}: {error.detail}", True
    if isinstance(error, httpx.HTTPError):
        return f"network error while {step}: {type(error).__name__}: {error}", True
    if isinstance(error, OSError):
        return f"host I/O error while {step}: {error}", True
    return f"unexpected agent error while {step}: {type(error).__name__}: {error}", True


class LeaseKeeper:
    """Renews a run's lease in the background; cancels the run once the server refuses it."""

    def __init__(
        self, client: DecodebenchClient, run_id: int, lease_seconds: float, cancel: Cancellation
    ) -> None:
        self._client = client
        self._run_id = run_id
        self._lease_seconds = lease_seconds
        self._interval_s = max(1.0, lease_seconds / 3)
        self._cancel = cancel
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._renew_until_stopped,
            name=f"{threading.current_thread().name}-lease",
            daemon=True,
        )
        self.lost = False

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopped.set()
        self._thread.join()

    def _renew_until_stopped(self) -> None:
        last_renewed = time.monotonic()
        overdue_logged = False
        while not self._stopped.wait(self._interval_s):
            try:
                self._client.renew_lease(self._run_id)
                last_renewed = time.monotonic()
                overdue_logged = False
            except ApiError as error:
                if 400 <= error.status_code < 500:
                    self._lose(f"lease lost: server refused renewal ({error})")
                    return
                log.warning("run %d: lease renewal failed, will retry: %s", self._run_id, error)
            except httpx.HTTPError as error:
                log.warning("run %d: lease renewal failed, will retry: %r", self._run_id, error)
            # Unreachable is not refused: the run goes on and its results wait in the outbox.
            # The server takes them if nobody claimed the run again meanwhile (and answers 409
            # if somebody did), so giving up here would only waste a finished run.
            if time.monotonic() - last_renewed > self._lease_seconds and not overdue_logged:
                overdue_logged = True
                log.warning(
                    "run %d: lease not renewed for %.0f s (server unreachable); carrying on",
                    self._run_id,
                    self._lease_seconds,
                )

    def _lose(self, reason: str) -> None:
        log.error("run %d: %s; abandoning it", self._run_id, reason)
        self.lost = True
        self._cancel.cancel(reason)


class RunExecutor:
    def __init__(
        self,
        client: DecodebenchClient,
        driver: DeviceDriver,
        cache: ArtifactCache,
        shutdown: threading.Event,
        outbox: Outbox,
        run_timeout_s: float = 3600.0,
    ) -> None:
        self.client = client
        self.driver = driver
        self.cache = cache
        self.shutdown = shutdown
        self.outbox = outbox
        self.run_timeout_s = run_timeout_s
        # Each run's results go up with the others finishing at that moment (one request).
        self.uploads = BatchedUploads(outbox, client.upload_many, shutdown)

    def execute(self, assignment: RunAssignment, device: DeviceInfo) -> RunOutcome:
        run_id = assignment.run_id
        started = time.monotonic()
        _log_claimed(assignment, device)
        cancel = Cancellation(self.shutdown)
        step = "preparing the job"
        with LeaseKeeper(self.client, run_id, assignment.lease_seconds, cancel) as lease:
            try:
                job = build_job(assignment, device)
                check_engine(self.driver, job)
                assign = getattr(self.driver, "assign", None)
                if assign is not None:  # stand-in devices time with the server's profile
                    assign(device, assignment)
                step = "fetching the artifact"
                artifact = self.cache.fetch(assignment.artifact_sha256)
                step = f"running on {device.udid}"
                result = run_on_device(
                    self.driver, device, artifact, job, cancel, timeout_s=self.run_timeout_s
                )
                step = "checking results"
                check_result(job, device, result)
            except Exception as error:
                return self._fail(assignment, error, step, lease_lost=lease.lost)
            if lease.lost:
                return RunOutcome(run_id, completed=False, reason=cancel.reason or "lease lost")
            # On disk before the first upload: a server outage of any length loses nothing.
            entry = self.outbox.put(run_id, result, hold=True)
            delivered = self.uploads.deliver(entry)
            refusal = self.outbox.refused.pop(entry, None)
            if refusal is not None:
                return self._fail(assignment, refusal, "uploading results", lease_lost=lease.lost)
        if not delivered:
            log.warning("run %d: results kept in the outbox for the next start", run_id)
        _log_completed(assignment, device, result, time.monotonic() - started)
        return RunOutcome(run_id, completed=True, result=result)

    def _fail(
        self, assignment: RunAssignment, error: Exception, step: str, lease_lost: bool
    ) -> RunOutcome:
        run_id = assignment.run_id
        reason, retryable = failure_reason(error, step)
        reason = reason[:MAX_REASON_CHARS]
        device_status = error.device_status if isinstance(error, DriverError) else None
        if lease_lost:
            log.warning("run %d abandoned (lease lost): %s", run_id, reason)
            return RunOutcome(run_id, completed=False, reason=reason, device_status=device_status)
        log_method = log.warning if isinstance(error, RunCancelled) else log.error
        log_method(
            "run %d failed (variant %s, %s): %s",
            run_id,
            assignment.variant_label,
            "retryable" if retryable else "not retryable",
            reason,
            exc_info=not isinstance(error, RunCancelled | DriverError | JobError | ResultMismatch),
        )
        try:
            self.client.fail_run(run_id, reason, retryable=retryable)
        except Exception as report_error:  # the lease will expire and the server will retry
            log.error("run %d: could not report the failure: %s", run_id, report_error)
        return RunOutcome(run_id, completed=False, reason=reason, device_status=device_status)


def _log_claimed(assignment: RunAssignment, device: DeviceInfo) -> None:
    profile = DEVICE_PROFILES.get(device.device_class)
    predicted = (
        f"{profile.predicted_tok_s(assignment.bytes_per_token):.1f} tok/s"
        if profile is not None and assignment.bytes_per_token > 0
        else "n/a"
    )
    log.info(
        "run %d claimed: %s variant %s on %s %s, %d prompts x %d tokens, artifact %s, "
        "%s bytes/token, roofline predicts %s",
        assignment.run_id,
        assignment.model,
        assignment.variant_label,
        device.device_class,
        device.udid,
        assignment.prompts,
        assignment.decode_tokens,
        assignment.artifact_sha256[:12],
        f"{assignment.bytes_per_token:,}",
        predicted,
    )


def _log_completed(
    assignment: RunAssignment, device: DeviceInfo, result: RunResult, wall_s: float
) -> None:
    per_prompt = [prompt.decode_tok_s for prompt in result.prompts]
    generated = sum(prompt.generated_tokens for prompt in result.prompts)
    decode_s = sum(sum(prompt.token_latencies_ms) for prompt in result.prompts) / 1000
    aggregate_tok_s = generated / decode_s if decode_s > 0 else float("nan")
    log.info(
        "run %d done: variant %s on %s %s: decode %.1f tok/s (per prompt %.1f-%.1f), "
        "median ttft %.1f ms, %s, %.2f s wall",
        assignment.run_id,
        assignment.variant_label,
        device.device_class,
        device.udid,
        aggregate_tok_s,
        min(per_prompt),
        max(per_prompt),
        statistics.median(prompt.ttft_ms for prompt in result.prompts),
        "simulated" if result.simulated else "measured",
        wall_s,
    )
