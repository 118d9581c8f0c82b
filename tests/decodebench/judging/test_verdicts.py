"""Verdicts against a baseline: direction per metric, the minimum effect, output agreement."""

from __future__ import annotations

import pytest

from decodebench.contracts.verdicts import JudgingError, Metric, Verdict
from decodebench.judging.measurements import VariantRuns
from decodebench.judging.verdicts import decide, judge_sweep, judge_variant
from decodebench.stats import summarize, t95
from tests.support.judging import PROMPTS, arm


def test_a_faster_variant_is_faster_in_tok_s_and_ttft_and_bigger_in_memory() -> None:
    row = judge_variant(
        arm("A", run_spread=0.01, seed=1),
        arm("B", speed=1.10, ttft=0.85, memory=1_200_000, run_spread=0.01, seed=2),
    )

    assert row.decode_tok_s.label == "faster" and row.decode_tok_s.verdict is Verdict.better
    assert row.decode_tok_s.ci_low < row.decode_tok_s.ratio < row.decode_tok_s.ci_high
    assert 1.0 < row.decode_tok_s.ci_low
    assert row.ttft_ms.label == "faster" and row.ttft_ms.ratio < 1  # lower TTFT is better
    assert row.ttft_ms.ci_high < 1
    assert row.peak_memory_bytes.label == "more memory"
    assert row.peak_memory_bytes.ratio == pytest.approx(1.2)
    assert row.regressions((Metric.decode_tok_s, Metric.ttft_ms)) == ()
    assert row.regressions(tuple(Metric)) == (row.peak_memory_bytes,)
    assert row.decode_tok_s.resampled == ("prompts", "runs")


def test_a_slower_variant_is_a_regression_of_both_speeds() -> None:
    row = judge_variant(
        arm("A", run_spread=0.01, seed=1), arm("B", speed=0.9, ttft=1.1, run_spread=0.01, seed=2)
    )

    assert [c.label for c in row.regressions((Metric.decode_tok_s, Metric.ttft_ms))] == [
        "slower",
        "slower",
    ]


def test_identical_measurements_give_no_significant_change_and_an_exact_ratio() -> None:
    row = judge_variant(arm("A"), arm("B"))

    for comparison in row.comparisons():
        assert comparison.verdict is Verdict.no_significant_change
        assert comparison.ratio == comparison.ci_low == comparison.ci_high == 1.0


def test_a_real_change_smaller_than_the_minimum_effect_is_not_a_verdict() -> None:
    baseline, variant = arm("A", run_spread=0.001, seed=1), arm("B", speed=1.01, seed=2)

    default = judge_variant(baseline, variant)
    assert default.decode_tok_s.ci_low > 1  # the 1% is resolved ...
    assert default.decode_tok_s.verdict is Verdict.no_significant_change  # ... but below 2%
    assert judge_variant(baseline, variant, min_effect=0.005).decode_tok_s.label == "faster"


@pytest.mark.parametrize(
    ("metric", "ratio", "low", "high", "expected"),
    [
        (Metric.decode_tok_s, 1.05, 1.01, 1.09, Verdict.better),
        (Metric.decode_tok_s, 1.05, 0.99, 1.09, Verdict.no_significant_change),
        (Metric.ttft_ms, 1.05, 1.01, 1.09, Verdict.worse),
        (Metric.ttft_ms, 0.95, 0.91, 0.99, Verdict.better),
        (Metric.peak_memory_bytes, 0.97, 0.97, 0.97, Verdict.better),
        (Metric.decode_tok_s, 0.985, 0.98, 0.99, Verdict.no_significant_change),
    ],
)
def test_decision_rule(
    metric: Metric, ratio: float, low: float, high: float, expected: Verdict
) -> None:
    assert decide(metric, ratio, low, high, 0.02) is expected


def test_one_run_per_variant_is_judged_on_prompts_alone_and_says_so() -> None:
    row = judge_variant(arm("A", runs=1), arm("B", speed=1.1, runs=1))

    assert row.decode_tok_s.resampled == ("prompts",)
    assert any("one run per variant" in note for note in row.notes)


def test_unpaired_runs_are_left_out_and_noted() -> None:
    row = judge_variant(arm("A", runs=4), arm("B", runs=3))

    assert row.decode_tok_s.run_pairs == 3
    assert any("without a partner" in note for note in row.notes)


def test_output_agreement_lists_diverging_prompts_and_mean_first_divergence() -> None:
    baseline = arm("A", tokens={})
    variant = arm("B", tokens={3: [1, 2, 9, 9], 7: [5, 2, 3, 4]})

    agreement = judge_variant(baseline, variant).agreement

    assert agreement is not None
    assert agreement.prompts_compared == PROMPTS
    assert agreement.identical_share == pytest.approx(28 / 30)
    assert agreement.diverging_prompts == (3, 7)
    assert agreement.mean_first_divergence == pytest.approx((2 + 0) / 2)
    assert judge_variant(arm("A", tokens={}), arm("B", tokens={})).agreement.identical
    assert judge_variant(arm("A"), arm("B", tokens={})).agreement is None


def test_a_sweep_is_judged_against_the_first_variant_or_the_named_one() -> None:
    arms = [
        arm("A"),
        arm("B", speed=1.1),
        arm("C", speed=0.9),
        arm("A", device_class="iphone-16-pro"),
        arm("C", speed=0.9, device_class="iphone-16-pro"),
    ]

    rows = judge_sweep(arms)
    assert [(r.variant, r.baseline, r.device_class) for r in rows] == [
        ("B", "A", "iphone-17-pro"),
        ("C", "A", "iphone-17-pro"),
        ("C", "A", "iphone-16-pro"),
    ]
    named = judge_sweep(arms[:3], baseline="C")
    assert [(r.variant, r.decode_tok_s.label) for r in named] == [("A", "faster"), ("B", "faster")]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: judge_variant(arm("A"), arm("B"), min_effect=0.6), "min_effect"),
        (lambda: judge_variant(arm("A"), arm("B"), min_effect=float("nan")), "min_effect"),
        (
            lambda: judge_variant(arm("A"), arm("B", device_class="iphone-16-pro")),
            "device classes differ",
        ),
        (lambda: judge_sweep([arm("A"), arm("B")], baseline="Z"), "baseline 'Z'"),
        (lambda: judge_sweep([]), "no measured variant"),
    ],
)
def test_bad_input_is_refused_naming_what_is_wrong(call, message: str) -> None:
    with pytest.raises(JudgingError, match=message):
        call()


def test_runs_of_disjoint_repetitions_cannot_be_paired() -> None:
    baseline = arm("A", runs=1)
    other = VariantRuns(
        variant="B",
        device_class="iphone-17-pro",
        runs=(arm("B", runs=1).runs[0].model_copy(update={"repetition": 5}),),
    )
    with pytest.raises(JudgingError, match="no repetition has a run of both"):
        judge_variant(baseline, other)


def test_t_quantiles_come_from_scipy_and_match_the_published_table() -> None:
    assert t95(1) == pytest.approx(12.706, abs=5e-4)
    assert t95(30) == pytest.approx(2.042, abs=5e-4)
    assert t95(10_000) == pytest.approx(1.960, abs=1e-3)
    summary = summarize([1.0, 2.0, 3.0])
    assert summary.ci95_half_width == pytest.approx(4.303 * 1.0 / 3**0.5, abs=1e-3)
    with pytest.raises(ValueError, match="non-finite"):
        summarize([1.0, float("inf")])


def test_the_judge_imports_without_torch_or_coremltools() -> None:
    import subprocess
    import sys

    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'coremltools', 'transformers'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import decodebench.judging.gate, decodebench.judging.nightly\n"
        "import decodebench.judging.simulation, decodebench.judging.verdicts, decodebench.stats\n"
    )
    subprocess.run([sys.executable, "-c", blocker], check=True)
