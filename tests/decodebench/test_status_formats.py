"""Both formats of one model side by side: a Core AI variant's label leads with its format, and
the status table shows each row's format and its loads (a Core AI cold load: specialization)."""

from __future__ import annotations

from datetime import UTC, datetime

from decodebench.commands.status import format_comparison
from decodebench.contracts.api import ComparisonRow, SweepDetail
from decodebench.contracts.domain import SweepSpec, VariantSpec


def test_a_core_ai_label_leads_with_its_format_and_a_core_ml_label_is_unchanged() -> None:
    assert VariantSpec(context=64).label == "folded-ctx64-fp16"
    assert VariantSpec(format="coreai", context=64).label == "coreai-folded-ctx64-fp16"
    assert VariantSpec(kv="input", context=64).label == "folded-ctx64-fp16-kvinput"
    repeat = VariantSpec(format="coreai", attention="repeat_kv", context=128, layers=1)
    assert repeat.label == "coreai-repeat_kv-ctx128-fp16-L1"


def _row(variant: VariantSpec, cold: float | None, warm: float | None) -> ComparisonRow:
    return ComparisonRow(
        variant=variant.label, build_id=1, build_state="succeeded", device_class="iphone-17-pro",
        device_name="iPhone 17 Pro", runs_total=1, runs_succeeded=1, runs_failed=0,
        prompts_measured=3, decode_tok_s_mean=40.0, decode_tok_s_ci95=1.5, speedup_vs_first=1.0,
        predicted_tok_s=41.0, prediction_calibrated=False, prediction_source="built-in",
        tile_ops=0, tile_mib=0.0, bytes_per_token=1000, simulated=True,
        format=variant.format, load_time_cold_ms=cold, load_time_warm_ms=warm,
    )  # fmt: skip


def test_the_status_table_shows_each_rows_format_and_loads() -> None:
    coreml, coreai = VariantSpec(context=64), VariantSpec(format="coreai", context=64)
    spec = SweepSpec(model="tiny-gqa", variants=[coreml, coreai], devices=["iphone-17-pro"])
    sweep = SweepDetail(
        id=4, model="tiny-gqa", state="completed", submitted_by="ci",
        created_at=datetime.now(UTC), finished_at=None, variants=[coreml.label, coreai.label],
        devices=["iphone-17-pro"], spec=spec, baseline=coreml.label, min_effect=0.02,
        verdicts=[], verdicts_note=None, builds=[], runs=[], simulated=True,
        results=[_row(coreml, 412.4, 35.2), _row(coreai, 903.0, 40.6)],
    )  # fmt: skip

    lines = format_comparison(sweep).splitlines()

    assert "format" in lines[1] and "load ms cold / warm" in lines[1]
    rows = [line for line in lines if line.startswith("iphone-17-pro")]
    assert "folded-ctx64-fp16 " in rows[0] and " Core ML " in rows[0]
    assert "412 / 35" in rows[0] and "specialization" not in rows[0]
    assert "coreai-folded-ctx64-fp16" in rows[1] and " Core AI " in rows[1]
    assert "903 (specialization) / 41" in rows[1]


def test_a_row_of_one_sample_says_n_1_instead_of_a_zero_width_interval() -> None:
    variant = VariantSpec(context=64)
    one = _row(variant, 1.0, 1.0).model_copy(
        update={"prompts_measured": 1, "decode_tok_s_ci95": None}
    )
    spec = SweepSpec(model="tiny-gqa", variants=[variant], devices=["iphone-17-pro"])
    sweep = SweepDetail(
        id=5, model="tiny-gqa", state="completed", submitted_by="ci",
        created_at=datetime.now(UTC), finished_at=None, variants=[variant.label],
        devices=["iphone-17-pro"], spec=spec, baseline=variant.label, min_effect=0.02,
        verdicts=[], verdicts_note=None, builds=[], runs=[], simulated=True, results=[one],
    )  # fmt: skip
    table = format_comparison(sweep)
    assert "40.0 (n = 1)" in table and "±" not in table.split("\n", 2)[2]
