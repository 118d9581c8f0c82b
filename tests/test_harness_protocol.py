"""The decode sweep protocol every harness follows (decodebench.harness), on a scripted engine."""

from __future__ import annotations

import pytest

from decodebench.emulated.timing import RooflineClock, RunNoise, TimingParameters
from decodebench.harness import (
    DoneMarker,
    HarnessJob,
    HarnessPrompt,
    model_dir,
    package_path,
    run_prompt,
    run_prompts,
)
from decodebench.profiles import IPHONE_16_PRO


class ScriptedEngine:
    """Step k takes (k + 1) ms of a fake clock and answers `token + 100` (or None)."""

    def __init__(self, knows_tokens: bool = True) -> None:
        self.now = 0
        self.steps: list[tuple[int, int]] = []
        self.resets = 0
        self.knows_tokens = knows_tokens

    def now_ns(self) -> int:
        return self.now

    def reset(self) -> None:
        self.resets += 1

    def step(self, token: int, position: int) -> int | None:
        self.steps.append((token, position))
        self.now += len(self.steps) * 1_000_000
        return token + 100 if self.knows_tokens else None


def test_prefill_then_greedy_decode_with_one_latency_per_generated_token() -> None:
    engine = ScriptedEngine()

    result = run_prompt(
        engine, engine, HarnessPrompt(index=4, token_ids=[1, 2, 3]), decode_tokens=3
    )

    # 3 prompt steps, then 2 decode steps feeding g1 and g2: n + N - 1 in all
    assert engine.steps == [(1, 0), (2, 1), (3, 2), (103, 3), (203, 4)]
    assert result.token_ids == [103, 203, 303]
    assert result.token_latencies_ms == [3.0, 4.0, 5.0]  # entry 0 is the last prefill step
    assert result.ttft_ms == 1 + 2 + 3
    assert result.prefill_tok_s == pytest.approx(3 / 0.006)
    assert result.decode_tok_s == pytest.approx(2 / 0.009)  # pure decode steps only
    assert (result.prompt_index, result.prompt_tokens, result.generated_tokens) == (4, 3, 3)
    assert engine.resets == 1


def test_a_single_token_budget_is_rated_by_its_only_step() -> None:
    engine = ScriptedEngine()

    result = run_prompt(engine, engine, HarnessPrompt(index=0, token_ids=[7, 8]), decode_tokens=1)

    assert len(engine.steps) == 2
    assert result.decode_tok_s == pytest.approx(1 / 0.002)
    assert result.token_ids == [108]


def test_without_known_tokens_the_last_prompt_token_is_fed_and_none_reported() -> None:
    engine = ScriptedEngine(knows_tokens=False)

    result = run_prompt(engine, engine, HarnessPrompt(index=0, token_ids=[5, 6]), decode_tokens=3)

    assert engine.steps[2:] == [(6, 2), (6, 3)]
    assert result.token_ids is None


def test_warm_up_steps_are_run_then_forgotten() -> None:
    engine = ScriptedEngine()
    prompts = [HarnessPrompt(index=0, token_ids=[9]), HarnessPrompt(index=1, token_ids=[10, 11])]

    results = run_prompts(engine, engine, prompts, decode_tokens=2, warmup_steps=2)

    assert engine.steps[:2] == [(9, 0), (9, 1)]
    assert engine.resets == 3  # after warm-up, and before each prompt
    assert [r.prompt_index for r in results] == [0, 1]
    assert results[1].ttft_ms == 5 + 6  # warm-up steps not counted


def test_the_roofline_clock_charges_bytes_over_bandwidth_per_step() -> None:
    bytes_per_token = 500_000_000
    noise = RunNoise.for_run(IPHONE_16_PRO, TimingParameters(noise_scale=0), "udid", 1)
    clock = RooflineClock(IPHONE_16_PRO, bytes_per_token, noise, seed=1)

    result = run_prompt(
        clock, clock, HarnessPrompt(index=0, token_ids=[1, 2, 3, 4]), decode_tokens=5
    )

    step_ms = bytes_per_token / IPHONE_16_PRO.effective_bandwidth_bytes_s * 1000
    assert result.ttft_ms == pytest.approx(4 * step_ms, rel=1e-6)
    assert result.decode_tok_s == pytest.approx(
        IPHONE_16_PRO.predicted_tok_s(bytes_per_token), rel=1e-6
    )
    assert clock.elapsed_s == pytest.approx(8 * step_ms / 1000, rel=1e-6)


def test_job_layout_and_marker_round_trip() -> None:
    sha = "ab" * 32
    job = HarnessJob(
        run_id=3,
        model="tiny-gqa",
        variant_label="folded",
        device_class="iphone-17-pro",
        artifact_sha256=sha,
        package_path=package_path(sha),
        bytes_per_token=10,
        context_tokens=64,
        decode_tokens=2,
        prompt_set_version="builtin-v1",
        prompts=[HarnessPrompt(index=0, token_ids=[1])],
    )

    assert job.package_path == f"models/{sha}/model.mlpackage"
    assert model_dir(sha) == f"models/{sha}"
    assert HarnessJob.model_validate_json(job.model_dump_json()) == job
    marker = DoneMarker(run_id=3, ok=False, error="model failed to compile")
    assert DoneMarker.model_validate_json(marker.model_dump_json()) == marker
