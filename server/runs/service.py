"""Runs: claimed by agents under a lease, results uploaded idempotently per prompt."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from pydantic import TypeAdapter
from sqlalchemy import Float, Integer, Table, TextClause, bindparam, exists, select, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from decodebench.contracts.api import RateSummary, RunSummary
from decodebench.contracts.results import PromptResult, RunResult
from decodebench.stats import summarize
from server.db import follow_up_after_commit
from server.errors import Conflict, InvalidInput, NotFound
from server.models import (
    TERMINAL_RUN_STATES,
    Build,
    BuildState,
    Device,
    PromptResultRow,
    Run,
    RunState,
    Sweep,
    SweepState,
)
from server.runs.queue import BatchShares
from server.transitions import move


def get_run(session: Session, run_id: int, *, lock: bool = False) -> Run:
    statement = select(Run).where(Run.id == run_id)
    if lock:
        statement = statement.with_for_update()
    run = session.scalar(statement)
    if run is None:
        raise NotFound(f"no run {run_id}")
    return run


def _sweep_target(session: Session, sweep_id: int) -> tuple[SweepState, str, bool]:
    states = session.execute(
        select(Run.state, Build.state)
        .join(Build, Build.id == Run.build_id)
        .where(Run.sweep_id == sweep_id)
    ).all()
    return _target_of([(run_state, build_state) for run_state, build_state in states])


def _target_of(states: Sequence[tuple[str, str]]) -> tuple[SweepState, str, bool]:
    run_states = [run_state for run_state, _ in states]
    if all(state in TERMINAL_RUN_STATES for state in run_states):
        failed = run_states.count(RunState.failed)
        if failed:
            return SweepState.failed, f"{failed} of {len(run_states)} runs failed", True
        return SweepState.completed, "all runs succeeded", True
    if any(build_state != BuildState.succeeded for _, build_state in states):
        return SweepState.building, "waiting for builds", False
    return SweepState.running, "all builds ready; runs in progress", False


def refresh_sweep_state(session: Session, sweep_id: int) -> None:
    sweep = session.scalar(select(Sweep).where(Sweep.id == sweep_id).with_for_update())
    if sweep is None:
        return
    target, reason, ended = _sweep_target(session, sweep_id)
    if ended and sweep.finished_at is None:
        sweep.finished_at = datetime.now(UTC)
    move(session, "sweep", sweep, target, reason)


# One round trip: the sweeps' states, and whether any of each one's runs has yet to end.
_SWEEP_STATES_AND_RUN_LEFT = (
    select(
        Sweep.id,
        Sweep.state,
        exists()
        .where(Run.sweep_id == Sweep.id, Run.state.not_in(list(TERMINAL_RUN_STATES)))
        .label("run_left"),
    )
    .where(Sweep.id.in_(bindparam("sweep_ids", expanding=True)))
    .order_by(Sweep.id)
)
_SETTLING_KEY = "sweeps to settle"


def settle_sweep_after_commit(session: Session, sweep_id: int) -> None:
    """Bring the sweep's state up to date once this transaction is committed.

    Every claim and upload used to lock the sweep row, so all devices of a sweep queued on it.
    Checked after the commit, the last of two concurrently finishing runs always sees both
    (its check starts after its own commit, which follows or precedes the other's check), so
    the lock is taken only when the state actually changes. The sweeps of a transaction (a
    batch of uploads) are checked together, in one statement."""
    sweeps: set[int] = set()
    if follow_up_after_commit(
        session, lambda follow_up: _settle_sweeps(follow_up, sweeps), once=_SETTLING_KEY
    ):
        session.info[_SETTLING_KEY] = sweeps  # this transaction's; a rollback starts anew
    session.info[_SETTLING_KEY].add(sweep_id)


def _settle_sweeps(follow_up: Session, sweeps: set[int]) -> None:
    sweep_ids = sorted(sweeps)
    found = follow_up.execute(_SWEEP_STATES_AND_RUN_LEFT, {"sweep_ids": sweep_ids}).all()
    for sweep_id, state, run_left in found:
        if state == SweepState.running and run_left:
            continue  # a run is left, so it stays running: no need to read all of its runs
        if _sweep_target(follow_up, sweep_id)[0] != state:
            refresh_sweep_state(follow_up, sweep_id)
            follow_up.commit()  # one sweep's row lock at a time


def refresh_sweeps_of_build(session: Session, build_id: int) -> None:
    sweep_ids = session.scalars(
        select(Run.sweep_id).where(Run.build_id == build_id).distinct()
    ).all()
    for sweep_id in sorted(sweep_ids):
        refresh_sweep_state(session, sweep_id)


def expire_leases(session: Session, max_attempts: int) -> int:
    """Runs whose agent stopped renewing go back to the queue, or fail after too many tries."""
    now = datetime.now(UTC)
    expired = session.scalars(
        select(Run)
        .where(Run.state == RunState.running, Run.lease_expires_at < now)
        .with_for_update(skip_locked=True)
    ).all()
    for run in expired:
        _requeue_or_fail(session, run, f"lease expired on device {run.device_udid}", max_attempts)
    return len(expired)


def _requeue_or_fail(session: Session, run: Run, reason: str, max_attempts: int) -> None:
    run.failure_reason = reason
    run.lease_expires_at = None
    if run.attempts >= max_attempts:
        run.finished_at = datetime.now(UTC)
        if max_attempts > 0:
            run.failure_reason = f"{reason} (gave up after {run.attempts} attempts)"
        move(session, "run", run, RunState.failed, run.failure_reason)
        refresh_sweep_state(session, run.sweep_id)
    else:
        move(session, "run", run, RunState.queued, f"{reason}; retrying")


def claim_run(
    session: Session,
    agent_id: int,
    device_udid: str,
    lease_seconds: int,
    *,
    claim_key: str | None = None,
    max_attempts: int = 3,
    aging_s: float = 300.0,
) -> tuple[Run | None, str]:
    """The device's next run under a lease, or None; and the device's class (what an idle
    device's long poll waits on): a batch of one (`claim_runs`), except that a claim without a
    key is allowed (and refused while the device holds a run). Touches only the device's row
    (locked, so one device's claims run one after the other: a retry waits for the claim it
    repeats) and the runs it reads or takes (SKIP LOCKED): no row every device waits on."""
    given, waiting = claim_runs(
        session,
        agent_id,
        [(device_udid, claim_key)],
        lease_seconds,
        max_attempts=max_attempts,
        aging_s=aging_s,
    )
    run = given.get(device_udid)
    if run is None:
        (device_class,) = waiting  # a device left without a run: its class waits
        return None, device_class
    return run, run.device_class


def claim_runs(
    session: Session,
    agent_id: int,
    claims: Sequence[tuple[str, str | None]],
    lease_seconds: int,
    *,
    max_attempts: int = 3,
    aging_s: float = 300.0,
) -> tuple[dict[str, Run], set[str]]:
    """`claim_run` for several devices of one agent at once, ``claims`` being (device, claim
    key) pairs: the runs given, by device, and the classes of the devices left without one.

    The same rules per device, in fewer statements: the devices' rows are locked in one
    statement (in id order, as a heartbeat locks them, so it deadlocks with neither another
    batch nor a heartbeat), their held runs read in one, and each class's fair-share ranking is
    read once for all of its devices."""
    udids = sorted(udid for udid, _ in claims)
    keys = dict(claims)
    devices = {
        device.udid: device
        for device in session.scalars(
            select(Device).where(Device.udid.in_(udids)).order_by(Device.id).with_for_update()
        )
    }
    for udid in udids:
        device = devices.get(udid)
        if device is None or device.agent_id != agent_id:
            raise NotFound(f"device {udid} is not registered to this agent")
    now = datetime.now(UTC)
    held_by: dict[str, list[Run]] = {}
    for run in session.scalars(
        select(Run)
        .where(Run.device_udid.in_(udids), Run.state == RunState.running)
        .order_by(Run.id)
        .with_for_update()
    ):
        held_by.setdefault(run.device_udid or "", []).append(run)
    given: dict[str, Run] = {}
    wanting: dict[tuple[str, int | None], list[str]] = {}
    for udid in udids:
        device = devices[udid]
        held = held_by.get(udid, [])
        again = _held_or_given_up(
            session, device, held, agent_id, keys[udid], lease_seconds, now, max_attempts
        )
        if again is not None:
            given[udid] = again
        else:
            wanting.setdefault((device.device_class, device.project_id), []).append(udid)
    waiting: set[str] = set()
    for (device_class, project_id), group in wanting.items():
        shares = BatchShares(session, device_class, aging_s, project_id, len(group))
        for udid in group:
            taken = shares.take(udid, now)
            if taken is None:
                waiting.add(device_class)
                break  # this class has nothing more for this batch
            _lease(session, taken, agent_id, udid, keys[udid], lease_seconds, now)
            given[udid] = taken
    return given, waiting


def _held_or_given_up(
    session: Session,
    device: Device,
    held: Sequence[Run],
    agent_id: int,
    claim_key: str | None,
    lease_seconds: int,
    now: datetime,
    max_attempts: int,
) -> Run | None:
    """The run a repeated claim (same key) gets back, its lease renewed; else None, the device's
    other held runs given up (queued again). Without a key a held run is a conflict."""
    for run in held:
        if claim_key is not None and run.claim_key == claim_key and run.agent_id == agent_id:
            # The same claim again (its answer was lost): the same run, its lease renewed.
            run.lease_expires_at = now + timedelta(seconds=lease_seconds)
            return run
    if held and claim_key is None:
        raise Conflict(f"device {device.udid} already has a run in progress")
    for run in held:
        # A new claim key means the agent no longer holds this run (it restarted, or gave the
        # run up): queue it again now rather than when its lease runs out.
        _requeue_or_fail(
            session,
            run,
            f"device {device.udid} claimed anew; its agent gave the run up",
            max_attempts,
        )
    return None


def _lease(
    session: Session,
    run: Run,
    agent_id: int,
    device_udid: str,
    claim_key: str | None,
    lease_seconds: int,
    now: datetime,
) -> None:
    run.attempts += 1
    run.agent_id = agent_id
    run.device_udid = device_udid
    run.claim_key = claim_key
    run.started_at = now
    run.lease_expires_at = now + timedelta(seconds=lease_seconds)
    # A claim changes no sweep's state: its run was queued, so its build had succeeded and the
    # sweep was already running (or building for its other builds), and it stays so.
    move(session, "run", run, RunState.running, f"claimed for {device_udid}")


def _owned_running_run(session: Session, run_id: int, agent_id: int) -> Run:
    run = get_run(session, run_id, lock=True)
    if run.agent_id != agent_id:
        raise Conflict(f"run {run_id} is not leased to this agent")
    if run.state != RunState.running:
        raise Conflict(f"run {run_id} is {run.state}, not running")
    return run


def renew_lease(session: Session, run_id: int, agent_id: int, lease_seconds: int) -> Run:
    run = _owned_running_run(session, run_id, agent_id)
    run.lease_expires_at = datetime.now(UTC) + timedelta(seconds=lease_seconds)
    return run


def fail_run(
    session: Session, run_id: int, agent_id: int, reason: str, retryable: bool, max_attempts: int
) -> Run:
    run = _owned_running_run(session, run_id, agent_id)
    _requeue_or_fail(session, run, reason, max_attempts if retryable else 0)
    return run


def fail_unassignable(session: Session, run: Run, reason: str) -> None:
    """A claimed run that cannot be handed out (its stored rows do not read) fails for good."""
    _requeue_or_fail(session, run, reason, 0)


_ForResults = tuple[Run, dict[str, Any], Device | None]


def runs_for_results(
    session: Session, uploads: Sequence[tuple[int, str]]
) -> dict[int, _ForResults]:
    """For a batch of (run, device the results name) uploads: each run (locked, in id order),
    its sweep's spec and the device, in two statements rather than one per run."""
    named = dict(uploads)
    rows = session.execute(
        select(Run, Sweep.spec)
        .join(Sweep, Sweep.id == Run.sweep_id)
        .where(Run.id.in_(sorted(named)))
        .order_by(Run.id)
        .with_for_update(of=Run)
    ).tuples()
    found = list(rows)
    devices = {
        device.udid: device
        for device in session.scalars(select(Device).where(Device.udid.in_(set(named.values()))))
    }
    return {run.id: (run, spec, devices.get(named[run.id])) for run, spec in found}


def record_results(
    session: Session,
    run_id: int,
    agent_id: int,
    result: RunResult,
    batch: dict[int, _ForResults] | None = None,
) -> Run:
    """Idempotent per (run, prompt) while the run runs; once it has ended its results are
    immutable: the same upload again is answered as stored, a different one is refused.
    ``batch``: what `runs_for_results` read for a batch of uploads this one belongs to."""
    found: _ForResults | None
    if batch is not None:
        found = batch.get(run_id)
    else:
        # One round trip for the run (locked), its sweep's spec and the device the results name.
        found = (
            session.execute(
                select(Run, Sweep.spec, Device)
                .join(Sweep, Sweep.id == Run.sweep_id)
                .outerjoin(Device, Device.udid == result.device_udid)
                .where(Run.id == run_id)
                .with_for_update(of=Run)
            )
            .tuples()
            .one_or_none()
        )
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
