"""The decode sweep protocol: the job a harness receives, how it runs it, and what it writes back.

One protocol, three implementations: the iOS harness (Swift, ``ios_harness/``), the emulated
iPhone's launcher (``emulator``) and the agent's host driver. Each drives a
*step engine*: the converted models take one token per call (``input_ids`` [1, 1], the KV cache
in state, or with ``kv="input"`` in arrays the harness holds and writes each step's new K/V
into), so prefill is the prompt fed one token at a time.

A job names its *engine*, the model format of its variant (:data:`HARNESS_ENGINES`): ``coreml``
(an ``.mlpackage`` on Core ML) or ``coreai`` (an ``.aimodel`` on Core AI, its K/V always
inputs). A job for any other engine is refused by name. For Core AI, the cold load is the
asset's *specialization* for the device (Core AI's compile step), the warm load a second load
of the specialized asset.

Per prompt, with ``n`` prompt tokens and ``N = decode_tokens``:

- the state is reset; steps over prompt tokens ``p_0 .. p_{n-1}`` at positions ``0 .. n-1`` are
  the *prefill*; the logits of the last one give the first generated token ``g_1``;
- steps feeding ``g_1 .. g_{N-1}`` at positions ``n .. n+N-2`` give ``g_2 .. g_N`` (greedy);
- **TTFT** (``ttft_ms``) is the prefill time: the summed duration of the ``n`` prefill steps,
  the last of which yields ``g_1``. There is no separate "first decode" step: the model takes
  one token per call, so the step that consumes ``p_{n-1}`` is the one that produces ``g_1``.
  What the harness does between steps (checking for interruption, sampling memory) is outside
  every timed step. ``prefill_tok_s = n / TTFT``;
- ``token_latencies_ms[k]`` is the time of the step that produced ``g_{k+1}``, so entry 0 is the
  last prefill step; ``decode_tok_s`` is ``(N - 1) / sum(latencies[1:])`` (pure decode steps),
  or ``1 / latencies[0]`` when ``N == 1``.

That is ``n + N - 1`` steps per prompt, the same count as ``decodebench.modeling.greedy_decode``,
so a prompt fits when ``n + N - 1 <= context``. Before the first prompt, ``warmup_steps`` steps
are run at positions ``0 .. warmup_steps - 1`` and discarded (first-call compilation and
allocation must not count); the state is reset after them, so they fit when
``warmup_steps <= context``. A job that breaks either bound is refused (:class:`HarnessJob`),
by the agent before it is pushed and by the harness before it compiles anything.

Measured around the sweep (``decodebench.contracts.results.RunResult``):

- **Memory**: ``peak_memory_bytes`` is the largest *physical footprint* of the harness process
  (``task_info`` ``phys_footprint``, what jetsam counts) sampled after every prefill and decode
  step of the timed prompts: the model as loaded for prediction, its KV cache and the runtime,
  not the on-device compilation. The compilation and both loads are reported apart as
  ``compile_peak_memory_bytes`` (the process's lifetime footprint peak when loading ends).
  Memory-mapped weights whose pages are clean are not part of a footprint; see
  ``ios_harness/README.md``.
- **Thermal state**: sampled after every prompt (``prompt_thermal_states``), at the start
  of the first timed prompt and after the last; before the first timed prompt the harness waits
  up to ``thermal_wait_s`` for ``nominal`` and reports how long it waited
  (``thermal_wait_ms``). ``low_power_mode`` records whether Low Power Mode was on.
- **Interruptions**: a harness that leaves the foreground mid-run (lock, app switch, a call)
  abandons the run: its done marker says ``ok: false``, ``reason: "interrupted"``.

The harness's Documents directory (pushed and pulled by the agent over AFC):

- ``job.json``: a :class:`HarnessJob`;
- ``models/<artifact sha256>/model.mlpackage`` (``model.aimodel`` for a Core AI job): the
  pushed package, complete once ``models/<artifact sha256>/complete`` exists (a push cut short
  leaves no marker);
- ``results.json``: a :class:`~decodebench.contracts.results.RunResult`, written atomically
  (``results.json.partial`` then rename);
- ``done``: a :class:`DoneMarker`, written after ``results.json`` (or instead of it on error,
  with a :class:`FailureReason`), always, also when ``job.json`` is missing or unreadable;
- ``harness.log``: the harness's own log lines.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from enum import StrEnum
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.names import (  # noqa: F401  (part of the harness protocol)
    ARTIFACT_NAMES,
    DEFAULT_FORMAT,
    DONE_MARKER,
    JOB_FILE,
    PACKAGE_NAME,
    RESULTS_FILE,
    FormatName,
)
from decodebench.contracts.results import PromptResult

HARNESS_PROTOCOL_VERSION = 1
HARNESS_BUNDLE_ID = "dev.decodebench.devices.harness"
HARNESS_PROCESS_NAME = "DecodebenchHarness"  # the app's executable: how its log lines are found

DOCUMENTS = "Documents"
PARTIAL_SUFFIX = ".partial"
HARNESS_LOG = "harness.log"
MODELS_DIR = "models"
COMPLETE_MARKER = "complete"
DEFAULT_WARMUP_STEPS = 2
DEFAULT_THERMAL_WAIT_S = 60.0
MAX_THERMAL_WAIT_S = 600.0
RUN_ID_ENVIRONMENT = "DECODEBENCH_RUN_ID"  # set at launch: the run a missing job belonged to
UNKNOWN_RUN_ID = -1


class FailureReason(StrEnum):
    """Why a harness wrote ``ok: false`` (``DoneMarker.reason``)."""

    interrupted = "interrupted"  # left the foreground mid-run: locked, app switch, a call
    missing_job = "missing_job"  # no job.json in Documents
    bad_job = "bad_job"  # job.json unreadable, or a job that cannot run (bounds)
    protocol_version = "protocol_version"  # job.json of another protocol version
    missing_package = "missing_package"  # the pushed package is absent or incomplete
    model_error = "model_error"  # compile, load or prediction failed; non-finite logits


def model_dir(artifact_sha256: str) -> str:
    """Where an artifact's package lives, relative to Documents."""
    return f"{MODELS_DIR}/{artifact_sha256}"


# The runtimes a harness decodes with, one per model format: a job's engine is its variant's
# format, and a job for another engine is refused by name.
HARNESS_ENGINE = DEFAULT_FORMAT.value
HARNESS_ENGINES = tuple(name.value for name in FormatName)


def artifact_name(engine: str = HARNESS_ENGINE) -> str:
    """The package's name on the phone for a job of ``engine`` (model.mlpackage, model.aimodel)."""
    if engine not in HARNESS_ENGINES:
        raise ValueError(
            f"engine {engine!r}: the harness decodes with {', '.join(HARNESS_ENGINES)}"
        )
    return ARTIFACT_NAMES[FormatName(engine)]


def package_engine(name: str) -> str:
    """The engine of a package by its folder's name (``.aimodel`` is Core AI, else Core ML)."""
    for engine in HARNESS_ENGINES:
        suffix = ARTIFACT_NAMES[FormatName(engine)].rpartition(".")[2]
        if name.endswith(f".{suffix}"):
            return engine
    return HARNESS_ENGINE


def package_path(artifact_sha256: str, engine: str = HARNESS_ENGINE) -> str:
    return f"{model_dir(artifact_sha256)}/{artifact_name(engine)}"


class HarnessPrompt(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0)
    token_ids: list[int] = Field(min_length=1)


class HarnessJob(BaseModel):
    """What the agent pushes to the device for the harness to run (its job.json)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    protocol_version: int = HARNESS_PROTOCOL_VERSION
    run_id: int
    model: str
    variant_label: str
    device_class: str
    device_udid: str = Field(default="", description="Echoed into results.json")
    driver: str = Field(default="", description="Echoed into results.json")
    artifact_sha256: str
    package_path: str = Field(
        default="", description="The package (.mlpackage or .aimodel), relative to Documents"
    )
    engine: str = Field(
        default=HARNESS_ENGINE,
        max_length=32,
        description="The runtime the phone decodes the package with: its model format "
        "(coreml or coreai)",
    )
    bytes_per_token: int = Field(description="Analysed bytes moved per decoded token")
    context_tokens: int = Field(ge=1, description="KV-cache length the model was built for")
    decode_tokens: int = Field(ge=1)
    warmup_steps: int = Field(
        default=DEFAULT_WARMUP_STEPS, ge=0, description="At most context_tokens (its own state)"
    )
    thermal_wait_s: float = Field(
        default=DEFAULT_THERMAL_WAIT_S,
        ge=0,
        le=MAX_THERMAL_WAIT_S,
        description="Longest wait for a nominal thermal state before the first timed prompt",
    )
    prompt_set_version: str
    variant: VariantSpec | None = Field(
        default=None, description="The build's variant, for reference decoders (not Core ML)"
    )
    prompts: list[HarnessPrompt] = Field(min_length=1)

    @model_validator(mode="after")
    def _runnable(self) -> HarnessJob:
        problem = job_problem(self)
        if problem is not None:
            raise ValueError(problem)
        return self


def job_problem(job: HarnessJob) -> str | None:
    """Why the harness cannot run `job` (protocol version, engine, context bounds), or None."""
    if job.protocol_version != HARNESS_PROTOCOL_VERSION:
        return (
            f"job.json speaks harness protocol {job.protocol_version}, the harness speaks "
            f"{HARNESS_PROTOCOL_VERSION}"
        )
    if job.engine not in HARNESS_ENGINES:
        return (
            f"job.json asks for engine {job.engine}; the harness decodes with "
            f"{' or '.join(HARNESS_ENGINES)}"
        )
    if job.variant is not None and job.variant.format.value != job.engine:
        return f"job.json asks for engine {job.engine} for a {job.variant.format.value} variant"
    if job.warmup_steps > job.context_tokens:
        return (
            f"warmup_steps {job.warmup_steps} exceeds the context of {job.context_tokens} "
            "tokens (warm-up step k writes KV position k)"
        )
    for prompt in job.prompts:
        steps = len(prompt.token_ids) + job.decode_tokens - 1
        if steps > job.context_tokens:
            return (
                f"prompt {prompt.index}: {len(prompt.token_ids)} prompt tokens + "
                f"{job.decode_tokens} decode tokens need {steps} KV positions, the context "
                f"holds {job.context_tokens}"
            )
    return None


class DoneMarker(BaseModel):
    """The harness's last word: results.json is complete (and its digest), or why there is none."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: int
    ok: bool
    results_sha256: str | None = None
    error: str | None = None
    reason: FailureReason | None = Field(default=None, description="Set when ok is false")
    protocol_version: int = HARNESS_PROTOCOL_VERSION


def results_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class StepEngine(Protocol):
    """One decode step of a model with its KV cache in state."""

    def reset(self) -> None:
        """Forget every cached position (a new prompt)."""

    def step(self, token: int, position: int) -> int | None:
        """Feed `token` at `position`; the greedy next token, or None when tokens are not known."""


class Clock(Protocol):
    def now_ns(self) -> int: ...


class RunInterrupted(Exception):
    """The harness left the foreground mid-run; the run is abandoned (reason ``interrupted``)."""


class SweepObserver(Protocol):
    """What a harness watches around the timed steps (never inside them)."""

    def after_step(self) -> None:
        """After every step of a timed prompt: sample memory; raise RunInterrupted if need be."""

    def after_prompt(self, result: PromptResult) -> PromptResult:
        """After every prompt (sample its thermal state); the result, as the harness keeps it."""


class Unobserved:
    def after_step(self) -> None:
        pass

    def after_prompt(self, result: PromptResult) -> PromptResult:
        return result


UNOBSERVED = Unobserved()


class MonotonicClock:
    """Wall-clock time that never goes backwards (what the iOS harness uses too)."""

    def now_ns(self) -> int:
        return time.perf_counter_ns()


def warm_up(engine: StepEngine, token: int, steps: int) -> None:
    for position in range(steps):
        engine.step(token, position)
    engine.reset()


def run_prompt(
    engine: StepEngine,
    clock: Clock,
    prompt: HarnessPrompt,
    decode_tokens: int,
    observer: SweepObserver = UNOBSERVED,
) -> PromptResult:
    """One prompt of the sweep, timed as the module docstring defines."""
    tokens = prompt.token_ids
    engine.reset()
    prefill_ns = 0
    step_ns = 0
    next_token: int | None = None
    for position, token in enumerate(tokens):
        step_started_ns = clock.now_ns()
        next_token = engine.step(token, position)
        step_ns = clock.now_ns() - step_started_ns
        prefill_ns += step_ns
        observer.after_step()  # outside the timed steps
    latencies_ns = [step_ns]
    generated: list[int | None] = [next_token]
    # Without known tokens, keep feeding the last prompt token: the cost of a step does not
    # depend on which token it is.
    feed = next_token if next_token is not None else tokens[-1]
    for position in range(len(tokens), len(tokens) + decode_tokens - 1):
        step_started_ns = clock.now_ns()
        next_token = engine.step(feed, position)
        latencies_ns.append(clock.now_ns() - step_started_ns)
        observer.after_step()
        generated.append(next_token)
        feed = next_token if next_token is not None else feed
    prefill_ns = max(prefill_ns, 1)
    decode_ns = sum(latencies_ns[1:]) if decode_tokens > 1 else latencies_ns[0]
    known = [token for token in generated if token is not None]
    result = PromptResult(
        prompt_index=prompt.index,
        prompt_tokens=len(tokens),
        generated_tokens=decode_tokens,
        ttft_ms=prefill_ns / 1e6,
        prefill_tok_s=len(tokens) / (prefill_ns / 1e9),
        decode_tok_s=max(decode_tokens - 1, 1) / (max(decode_ns, 1) / 1e9),
        token_latencies_ms=[latency / 1e6 for latency in latencies_ns],
        token_ids=known if len(known) == len(generated) else None,
    )
    return observer.after_prompt(result)


def run_prompts(
    engine: StepEngine,
    clock: Clock,
    prompts: Sequence[HarnessPrompt],
    decode_tokens: int,
    warmup_steps: int = DEFAULT_WARMUP_STEPS,
    observer: SweepObserver = UNOBSERVED,
) -> list[PromptResult]:
    """Warm up, then every prompt in order."""
    if prompts and warmup_steps:
        warm_up(engine, prompts[0].token_ids[0], warmup_steps)
    return [run_prompt(engine, clock, prompt, decode_tokens, observer) for prompt in prompts]
