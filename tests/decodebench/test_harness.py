"""The decode sweep protocol every harness follows (decodebench.harness), on a scripted engine."""

from __future__ import annotations

import pytest

from decodebench.contracts.profiles import IPHONE_16_PRO
from decodebench.contracts.results import PromptResult, RunResult
from decodebench.harness import (
    DoneMarker,
    HarnessJob,
    HarnessPrompt,
    RunInterrupted,
    artifact_name,
    model_dir,
    package_engine,
    package_path,
    run_prompt,
    run_prompts,
)
from decodebench.timing import RooflineClock, RunNoise, TimingParameters


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


def job(**fields: object) -> HarnessJob:
    values: dict[str, object] = {
        "run_id": 3,
        "model": "tiny-gqa",
        "variant_label": "folded",
        "device_class": "iphone-17-pro",
        "artifact_sha256": "ab" * 32,
        "bytes_per_token": 10,
        "context_tokens": 64,
        "decode_tokens": 8,
        "prompt_set_version": "builtin-v1",
        "prompts": [HarnessPrompt(index=0, token_ids=[1] * 57)],
    }
    return HarnessJob.model_validate({**values, **fields})


def test_the_harness_knows_a_core_ml_and_a_core_ai_engine_and_where_each_package_goes() -> None:
    coreai = job(engine="coreai", variant={"format": "coreai", "context": 64})

    assert (job().engine, coreai.engine) == ("coreml", "coreai")
    assert package_path("ab" * 32) == f"models/{'ab' * 32}/model.mlpackage"
    assert package_path("ab" * 32, "coreai") == f"models/{'ab' * 32}/model.aimodel"
    assert [package_engine(name) for name in ("model.aimodel", "x.mlpackage", "abc")] == [
        "coreai",
        "coreml",
        "coreml",
    ]
    with pytest.raises(ValueError, match="engine 'onnx': the harness decodes with coreml, coreai"):
        artifact_name("onnx")


def test_a_job_that_fits_its_context_exactly_is_accepted() -> None:
    assert job(warmup_steps=64).warmup_steps == 64  # 57 + 8 - 1 = 64 positions


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"warmup_steps": 65}, "warmup_steps 65 exceeds the context of 64 tokens"),
        (
            {"decode_tokens": 9},
            r"prompt 0: 57 prompt tokens \+ 9 decode tokens need 65 KV positions",
        ),
        ({"protocol_version": 2}, "job.json speaks harness protocol 2, the harness speaks 1"),
        (
            {"engine": "tflite"},
            "job.json asks for engine tflite; the harness decodes with coreml or coreai",
        ),
        (
            {"engine": "coreai", "variant": {"context": 64}},
            "job.json asks for engine coreai for a coreml variant",
        ),
        ({"thermal_wait_s": 601}, "thermal_wait_s"),
        ({"warmup_steps": -1}, "warmup_steps"),
    ],
)
def test_a_job_the_harness_cannot_run_is_refused_with_the_reason(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        job(**fields)


class Observer:
    """Counts steps and prompts, interrupts after `interrupt_after` steps."""

    def __init__(self, interrupt_after: int | None = None) -> None:
        self.steps = 0
        self.prompts = 0
        self.interrupt_after = interrupt_after

    def after_step(self) -> None:
        self.steps += 1
        if self.steps == self.interrupt_after:
            raise RunInterrupted("the app resigned active")

    def after_prompt(self, result: PromptResult) -> PromptResult:
        self.prompts += 1
        return result


def test_the_observer_runs_after_every_step_outside_the_timings() -> None:
    engine = ScriptedEngine()
    observer = Observer()

    result = run_prompt(engine, engine, HarnessPrompt(index=0, token_ids=[1, 2]), 3, observer)

    assert observer.steps == 4  # 2 prefill + 2 decode steps
    assert observer.prompts == 1
    assert result.ttft_ms == 1 + 2  # the prefill steps only


def test_an_interruption_ends_the_sweep_where_it_happens() -> None:
    engine = ScriptedEngine()
    prompts = [HarnessPrompt(index=i, token_ids=[1, 2]) for i in range(3)]

    with pytest.raises(RunInterrupted):
        run_prompts(engine, engine, prompts, 3, warmup_steps=0, observer=Observer(6))

    assert len(engine.steps) == 6  # one whole prompt and two steps of the second


def test_results_of_another_protocol_version_are_refused() -> None:
    result = RunResult(
        device_udid="u",
        device_class="iphone-17-pro",
        product_type="iPhone18,1",
        driver="pymobiledevice3",
        simulated=False,
        load_time_cold_ms=1,
        load_time_warm_ms=1,
        peak_memory_bytes=1,
        prompts=[PromptResult.model_validate(SAMPLE_PROMPT)],
    )
    data = result.model_dump() | {"protocol_version": 2}

    with pytest.raises(ValueError, match="results speak protocol 2, this side speaks 1"):
        RunResult.model_validate(data)


def test_one_thermal_sample_per_prompt() -> None:
    prompt = PromptResult.model_validate(SAMPLE_PROMPT)
    fields = {
        "device_udid": "u",
        "device_class": "iphone-17-pro",
        "product_type": "iPhone18,1",
        "driver": "pymobiledevice3",
        "simulated": False,
        "load_time_cold_ms": 1,
        "load_time_warm_ms": 1,
        "peak_memory_bytes": 1,
        "prompts": [prompt],
    }

    assert RunResult(**fields, prompt_thermal_states=["fair"]).prompt_thermal_states == ["fair"]
    with pytest.raises(ValueError, match="2 prompt_thermal_states for 1 prompts"):
        RunResult(**fields, prompt_thermal_states=["fair", "fair"])


SAMPLE_PROMPT = {
    "prompt_index": 0,
    "prompt_tokens": 1,
    "generated_tokens": 1,
    "ttft_ms": 1.0,
    "prefill_tok_s": 1.0,
    "decode_tok_s": 1.0,
    "token_latencies_ms": [1.0],
}
