"""A run's results: stored idempotently per prompt while it runs, immutable once it has ended.

An upload is a batch of one: `store_results` takes any number of runs' results in one
transaction (an agent's `POST /agents/results`, or one run's `POST /runs/{id}/results`) and
stores or refuses each run on its own."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

from pydantic import TypeAdapter
from sqlalchemy import Float, Integer, Table, TextClause, case, select, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from decodebench.contracts.api import RateSummary, RunSummary
from decodebench.contracts.results import PromptResult, RunResult
from decodebench.stats import summarize
from server.errors import Conflict, DecodebenchError, InvalidInput, NotFound
from server.models import Device, PromptResultRow, Run, RunState, Sweep
from server.runs.service import settle_sweep_after_commit
from server.transitions import move

_ForResults = tuple[Run, dict[str, Any], Device | None]
# What an upload may be refused for, run by run: no such run (404), not this agent's or no
# longer accepting results (409), results that do not fit the run (422).
REFUSALS = (NotFound, Conflict, InvalidInput)


def store_results(
    session: Session, agent_id: int, uploads: Sequence[tuple[int, RunResult]]
) -> list[tuple[int, Run | DecodebenchError]]:
    """Store each (run, results) upload of the agent, in run order: the run, or why its upload
    was refused (what its upload alone would have been answered), so one refused run does not
    hold back the others. One run's upload is a batch of one."""
    # The runs are locked in run order: two batches cannot deadlock.
    batch = _runs_for_results(session, [(run_id, result.device_udid) for run_id, result in uploads])
    stored: list[tuple[int, Run | DecodebenchError]] = []
    # The runs' changes are flushed together at the end (an UPDATE for all, an INSERT of all
    # their transitions), not run by run before the next one's statements.
    with session.no_autoflush:
        for run_id, result in sorted(uploads, key=lambda upload: upload[0]):
            try:
                stored.append((run_id, _record(session, run_id, agent_id, result, batch)))
            except REFUSALS as refusal:
                stored.append((run_id, refusal))
    return stored


def record_results(session: Session, run_id: int, agent_id: int, result: RunResult) -> Run:
    """One run's results: a batch of one (`store_results`), its refusal raised."""
    ((_, stored),) = store_results(session, agent_id, [(run_id, result)])
    if isinstance(stored, DecodebenchError):
        raise stored
    return stored


def _runs_for_results(
    session: Session, uploads: Sequence[tuple[int, str]]
) -> dict[int, _ForResults]:
    """For a batch of (run, device the results name) uploads: each run (locked, in id order),
    its sweep's spec and the device the results name, in one round trip for any number."""
    named = dict(uploads)
    rows = session.execute(
        select(Run, Sweep.spec, Device)
        .join(Sweep, Sweep.id == Run.sweep_id)
        .outerjoin(Device, Device.udid == case(named, value=Run.id))
        .where(Run.id.in_(sorted(named)))
        .order_by(Run.id)
        .with_for_update(of=Run)
    ).tuples()
    return {run.id: (run, spec, device) for run, spec, device in rows}


def _record(
    session: Session, run_id: int, agent_id: int, result: RunResult, batch: dict[int, _ForResults]
) -> Run:
    """Idempotent per (run, prompt) while the run runs; once it has ended its results are
    immutable: the same upload again is answered as stored, a different one is refused.
    ``batch``: what `_runs_for_results` read for the batch of uploads this one belongs to."""
    found = batch.get(run_id)
    if found is None:
        raise NotFound(f"no run {run_id}")
    run, spec, device = found
    if run.agent_id != agent_id:
        raise Conflict(f"run {run_id} is not leased to this agent")
    if run.state == RunState.succeeded:
        if _already_stored(session, run_id, result):
            return run
        raise Conflict(f"run {run_id} has ended (succeeded); its results are immutable")
    # A run whose lease ran out while its agent could not reach us (a server outage, say) went
    # back to the queue; nobody has claimed it since, so its finished results are still the
    # run's: take them rather than measure it again.
    late = run.state == RunState.queued and result.device_udid == run.device_udid
    if run.state != RunState.running and not late:
        raise Conflict(f"run {run_id} is {run.state}; results are no longer accepted")
    if result.device_udid != run.device_udid:
        raise InvalidInput(f"results are from {result.device_udid}, run is on {run.device_udid}")
    if result.device_class != run.device_class:
        raise InvalidInput(
            f"results are from a {result.device_class}, run needs {run.device_class}"
        )
    _check_labels(device, result)
    expected_prompts = int(spec["prompts"])
    decode_tokens = int(spec["decode_tokens"])
    for prompt in result.prompts:
        if prompt.prompt_index >= expected_prompts:
            raise InvalidInput(
                f"prompts.{prompt.prompt_index}: prompt_index is outside this run's "
                f"{expected_prompts} prompts"
            )
        if prompt.generated_tokens > decode_tokens:
            raise InvalidInput(
                f"prompts.{prompt.prompt_index}: generated_tokens {prompt.generated_tokens} "
                f"exceeds the sweep's decode_tokens {decode_tokens}"
            )
    # One round trip and one short statement for the whole batch: a run's prompts arrive in one
    # upload, and travel on as one JSON document.
    rows: Sequence[Any] = session.execute(_UPSERT_PROMPTS, _upsert_parameters(run_id, result)).all()
    if len({prompt.prompt_index for prompt in result.prompts}) < expected_prompts:
        # A partial upload: the run's figures are what is stored, earlier uploads included.
        rows = session.execute(
            select(PromptResultRow.decode_tok_s, PromptResultRow.ttft_ms).where(
                PromptResultRow.run_id == run_id
            )
        ).all()
    run.simulated = result.simulated
    run.driver = result.driver
    run.summary = _run_summary(result, rows)
    if len(rows) == expected_prompts and run.state in (RunState.running, RunState.queued):
        run.finished_at = datetime.now(UTC)
        run.lease_expires_at = None
        run.failure_reason = None
        reason = f"{len(rows)} prompts uploaded" + (" after its lease expired" if late else "")
        move(session, "run", run, RunState.succeeded, reason)
        settle_sweep_after_commit(session, run.sweep_id)
    return run


def _check_labels(device: Device | None, result: RunResult) -> None:
    """A result's labels must match the device its agent registered: an upload cannot turn a
    simulated or emulated device's timings into measured ones, nor claim another driver."""
    if device is None:
        raise InvalidInput(f"device_udid: {result.device_udid} is not a registered device")
    if result.driver != device.driver:
        raise InvalidInput(
            f"driver: results say {result.driver!r}, device {device.udid} registered "
            f"with driver {device.driver!r}"
        )
    if device.simulated and not result.simulated:
        raise InvalidInput(
            f"simulated: device {device.udid} registered as simulated ({device.driver}); "
            "its results cannot be marked measured"
        )


_RECORD_TYPES = {Integer: "integer", Float: "double precision", JSONB: "jsonb"}
_PROMPT_TABLE = cast(Table, PromptResultRow.__table__)
# The prompt's own figures: every column but the row's id and the two the run gives.
_PROMPT_FIELDS = [c.name for c in _PROMPT_TABLE.c if c.name not in ("id", "run_id", "simulated")]


def _upsert_prompts_statement() -> TextClause:
    """``INSERT … SELECT … FROM jsonb_to_recordset(<the prompts as one JSON array>) ON CONFLICT
    DO UPDATE``: the same short text for any number of prompts, so the driver parses and
    prepares it once per connection (a multi-row VALUES list was parsed again on every upload),
    and the prompts travel as one JSON document encoded in C, not value by value."""
    columns = {c.name: c for c in _PROMPT_TABLE.c}
    record = ", ".join(
        f"{name} {_RECORD_TYPES[type(columns[name].type)]}" for name in _PROMPT_FIELDS
    )
    updated = ", ".join(f"{name} = excluded.{name}" for name in [*_PROMPT_FIELDS, "simulated"]
                        if name != "prompt_index")  # fmt: skip
    fields = ", ".join(_PROMPT_FIELDS)
    return text(
        f"INSERT INTO prompt_results (run_id, simulated, {fields}) "
        f"SELECT :run_id, :simulated, {fields} "
        f"FROM jsonb_to_recordset(CAST(:prompts AS jsonb)) AS p({record}) "
        f"ON CONFLICT (run_id, prompt_index) DO UPDATE SET {updated} "
        "RETURNING decode_tok_s, ttft_ms"
    )


def _upsert_parameters(run_id: int, result: RunResult) -> dict[str, Any]:
    prompts = _PROMPTS_JSON.dump_json(result.prompts).decode()
    return {"run_id": run_id, "simulated": result.simulated, "prompts": prompts}


_UPSERT_PROMPTS = _upsert_prompts_statement()
_PROMPTS_JSON = TypeAdapter(list[PromptResult])


def _already_stored(session: Session, run_id: int, result: RunResult) -> bool:
    stored = {
        row.prompt_index: row
        for row in session.scalars(select(PromptResultRow).where(PromptResultRow.run_id == run_id))
    }
    for prompt in result.prompts:
        row = stored.get(prompt.prompt_index)
        if row is None or any(
            getattr(row, field) != value for field, value in prompt.model_dump().items()
        ):
            return False
    return True


def _run_summary(result: RunResult, rows: Sequence[Any]) -> dict[str, object]:
    decode = summarize([row.decode_tok_s for row in rows])
    summary = RunSummary(
        prompts=len(rows),
        decode_tok_s=RateSummary(**decode.model_dump()),
        ttft_ms_mean=sum(row.ttft_ms for row in rows) / len(rows),
        load_time_cold_ms=result.load_time_cold_ms,
        load_time_warm_ms=result.load_time_warm_ms,
        peak_memory_bytes=result.peak_memory_bytes,
        thermal_state_start=result.thermal_state_start,
        thermal_state_end=result.thermal_state_end,
        product_type=result.product_type,
        os_version=result.os_version,
        timing_model=result.timing_model,
        compile_peak_memory_bytes=result.compile_peak_memory_bytes,
        low_power_mode=result.low_power_mode,
        thermal_wait_ms=result.thermal_wait_ms,
        prompt_thermal_states=result.prompt_thermal_states,
    )
    return summary.model_dump(mode="json")
