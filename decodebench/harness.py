"""The decode sweep protocol: the job a harness receives, how it runs it, and what it writes back.

One protocol, three implementations: the iOS harness (Swift, ``ios_harness/``), the emulated
iPhone's launcher (``decodebench.emulated``) and the agent's host driver. Each drives a
*step engine*: the converted models take one token per call (``input_ids`` [1, 1], the KV cache
in state), so prefill is the prompt fed one token at a time.

Per prompt, with ``n`` prompt tokens and ``N = decode_tokens``:

- the state is reset; steps over prompt tokens ``p_0 .. p_{n-1}`` at positions ``0 .. n-1`` are
  the *prefill*; the logits of the last one give the first generated token ``g_1``;
- steps feeding ``g_1 .. g_{N-1}`` at positions ``n .. n+N-2`` give ``g_2 .. g_N`` (greedy);
- ``ttft_ms`` is the prefill time (clock start to ``g_1`` known); ``prefill_tok_s = n / prefill``;
- ``token_latencies_ms[k]`` is the time of the step that produced ``g_{k+1}``, so entry 0 is the
  last prefill step; ``decode_tok_s`` is ``(N - 1) / sum(latencies[1:])`` (pure decode steps),
  or ``1 / latencies[0]`` when ``N == 1``.

That is ``n + N - 1`` steps per prompt, the same count as ``decodebench.modeling.greedy_decode``,
so a prompt fits when ``n + N - 1 <= context``. Before the first prompt, ``warmup_steps`` steps
are run and discarded (first-call compilation and allocation must not count).

The harness's Documents directory (pushed and pulled by the agent over AFC):

- ``job.json``: a :class:`HarnessJob`;
- ``models/<artifact sha256>/model.mlpackage``: the pushed package, complete once
  ``models/<artifact sha256>/complete`` exists (a push cut short leaves no marker);
- ``results.json``: a :class:`~decodebench.contracts.protocol.RunResult`, written atomically
  (``results.json.partial`` then rename);
- ``done``: a :class:`DoneMarker`, written after ``results.json`` (or instead of it on error);
- ``harness.log``: the harness's own log lines.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.protocol import PromptResult

HARNESS_PROTOCOL_VERSION = 1
HARNESS_BUNDLE_ID = "dev.decodebench.harness"
HARNESS_PROCESS_NAME = "DecodebenchHarness"  # the app's executable: how its log lines are found

DOCUMENTS = "Documents"
JOB_FILE = "job.json"
RESULTS_FILE = "results.json"
PARTIAL_SUFFIX = ".partial"
DONE_MARKER = "done"
HARNESS_LOG = "harness.log"
MODELS_DIR = "models"
PACKAGE_NAME = "model.mlpackage"
COMPLETE_MARKER = "complete"
DEFAULT_WARMUP_STEPS = 2


def model_dir(artifact_sha256: str) -> str:
    """Where an artifact's package lives, relative to Documents."""
    return f"{MODELS_DIR}/{artifact_sha256}"


def package_path(artifact_sha256: str) -> str:
    return f"{model_dir(artifact_sha256)}/{PACKAGE_NAME}"


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
    package_path: str = Field(default="", description="The .mlpackage, relative to Documents")
    bytes_per_token: int = Field(description="Analysed bytes moved per decoded token")
    context_tokens: int = Field(ge=1, description="KV-cache length the model was built for")
    decode_tokens: int = Field(ge=1)
    warmup_steps: int = Field(default=DEFAULT_WARMUP_STEPS, ge=0)
    prompt_set_version: str
    variant: VariantSpec | None = Field(
        default=None, description="The build's variant, for reference decoders (not Core ML)"
    )
    prompts: list[HarnessPrompt] = Field(min_length=1)


class DoneMarker(BaseModel):
    """The harness's last word: results.json is complete (and its digest), or why there is none."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: int
    ok: bool
    results_sha256: str | None = None
    error: str | None = None


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


class MonotonicClock:
    """Wall-clock time that never goes backwards (what the iOS harness uses too)."""

    def now_ns(self) -> int:
        return time.perf_counter_ns()


def warm_up(engine: StepEngine, token: int, steps: int) -> None:
    for position in range(steps):
        engine.step(token, position)
    engine.reset()


def run_prompt(
    engine: StepEngine, clock: Clock, prompt: HarnessPrompt, decode_tokens: int
) -> PromptResult:
    """One prompt of the sweep, timed as the module docstring defines."""
    tokens = prompt.token_ids
    engine.reset()
    started_ns = clock.now_ns()
    step_started_ns = started_ns
    next_token: int | None = None
    for position, token in enumerate(tokens):
        step_started_ns = clock.now_ns()
        next_token = engine.step(token, position)
    prefill_done_ns = clock.now_ns()
    latencies_ns = [prefill_done_ns - step_started_ns]
    generated: list[int | None] = [next_token]
    # Without known tokens, keep feeding the last prompt token: the cost of a step does not
    # depend on which token it is.
    feed = next_token if next_token is not None else tokens[-1]
    for position in range(len(tokens), len(tokens) + decode_tokens - 1):
        step_started_ns = clock.now_ns()
        next_token = engine.step(feed, position)
        latencies_ns.append(clock.now_ns() - step_started_ns)
        generated.append(next_token)
        feed = next_token if next_token is not None else feed
    prefill_ns = max(prefill_done_ns - started_ns, 1)
    decode_ns = sum(latencies_ns[1:]) if decode_tokens > 1 else latencies_ns[0]
    known = [token for token in generated if token is not None]
    return PromptResult(
        prompt_index=prompt.index,
        prompt_tokens=len(tokens),
        generated_tokens=decode_tokens,
        ttft_ms=prefill_ns / 1e6,
        prefill_tok_s=len(tokens) / (prefill_ns / 1e9),
        decode_tok_s=max(decode_tokens - 1, 1) / (max(decode_ns, 1) / 1e9),
        token_latencies_ms=[latency / 1e6 for latency in latencies_ns],
        token_ids=known if len(known) == len(generated) else None,
    )


def run_prompts(
    engine: StepEngine,
    clock: Clock,
    prompts: Sequence[HarnessPrompt],
    decode_tokens: int,
    warmup_steps: int = DEFAULT_WARMUP_STEPS,
) -> list[PromptResult]:
    """Warm up, then every prompt in order."""
    if prompts and warmup_steps:
        warm_up(engine, prompts[0].token_ids[0], warmup_steps)
    return [run_prompt(engine, clock, prompt, decode_tokens) for prompt in prompts]
