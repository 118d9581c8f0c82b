"""The build diff over HTTP and as a page, on analyses of real tiny-gqa builds."""

from __future__ import annotations

import pytest

from decodebench.building.build import build_variant
from decodebench.contracts.analysis import GraphAnalysis
from decodebench.contracts.domain import Attention, VariantSpec
from decodebench.contracts.presets import TINY_GQA
from scripts.standins import build_report
from tests.support.api import bearer, complete_build, start_and_complete
from tests.support.pages import ui_sign_in

pytestmark = pytest.mark.slow

CONTEXT = 128
LAYERS = TINY_GQA.num_layers
SWEEP = {
    "model": "tiny-gqa",
    "variants": [{"attention": "repeat_kv", "context": CONTEXT}, {"attention": "folded", "context": CONTEXT}],
    "devices": ["iphone-17-pro"],
    "prompts": 2,
}  # fmt: skip


@pytest.fixture(scope="module")
def analyses(tmp_path_factory: pytest.TempPathFactory) -> dict[str, GraphAnalysis]:
    root = tmp_path_factory.mktemp("builds")
    built = {}
    for attention in Attention:
        variant = VariantSpec(attention=attention, context=CONTEXT)
        built[variant.label] = build_variant(
            TINY_GQA.name, variant, root / attention.value
        ).analysis
    return built


@pytest.fixture
def sweep(api, analyses, user_token: str, worker_token: str) -> dict:
    created = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token)).json()
    for build in created["builds"]:
        complete_build(api, build, worker_token, analyses[build["label"]].model_dump(mode="json"))
    return created


def test_diff_endpoint(api, sweep, user_token, analyses) -> None:
    a, b = (build["id"] for build in sweep["builds"])
    response = api.get(f"/api/v1/builds/{a}/diff/{b}", headers=bearer(user_token))
    assert response.status_code == 200, response.text
    diff = response.json()
    assert diff["a"] == f"build {a}: tiny-gqa repeat_kv-ctx{CONTEXT}-fp16"
    assert diff["b"] == f"build {b}: tiny-gqa folded-ctx{CONTEXT}-fp16"
    assert len(diff["redundant_only_in_a"]) == 2 * LAYERS and diff["redundant_only_in_b"] == []
    tile_bytes = TINY_GQA.num_attention_heads * CONTEXT * TINY_GQA.head_dim * 2
    assert diff["redundant_removed_bytes"] == 2 * LAYERS * tile_bytes
    assert diff["bytes_per_token"]["redundant"]["delta"] == -4 * LAYERS * tile_bytes
    expected = (
        analyses[f"repeat_kv-ctx{CONTEXT}-fp16"].bytes_per_token.total
        / analyses[f"folded-ctx{CONTEXT}-fp16"].bytes_per_token.total
    )
    assert diff["bytes_speedup"] == pytest.approx(expected)
    assert diff["predicted"]["iphone-17-pro"]["speedup"] == pytest.approx(expected)
    reverse = api.get(f"/api/v1/builds/{b}/diff/{a}", headers=bearer(user_token)).json()
    assert reverse["bytes_speedup"] == pytest.approx(1 / expected)


def test_diff_predictions_use_the_current_profiles(api, sweep, user_token, analyses) -> None:
    from server import tenancy
    from server.db import get_sessionmaker
    from server.models import ProfileCalibration

    with get_sessionmaker()() as session, session.begin():
        session.add(
            ProfileCalibration(
                device_class="iphone-17-pro", effective_bandwidth_mb_s=40_000.0,
                dispatch_overhead_us=20.0, calibrated_parameters=["effective_bandwidth_mb_s",
                "dispatch_overhead_us"], runs=8, builds=2, includes_simulated=False,
                rms_relative_error=0.01, note="", points=[], requested_by="test",
                project_id=tenancy.project_named(session, "default").id,  # the user's project
            )
        )  # fmt: skip
    a, b = (build["id"] for build in sweep["builds"])
    diff = api.get(f"/api/v1/builds/{a}/diff/{b}", headers=bearer(user_token)).json()
    folded = analyses[f"folded-ctx{CONTEXT}-fp16"]
    seconds = folded.bytes_per_token.total / 40e9 + folded.dispatch_ops * 20e-6
    assert diff["predicted"]["iphone-17-pro"]["b"] == pytest.approx(1 / seconds)
    assert diff["predicted"]["iphone-17-pro"]["speedup"] != pytest.approx(diff["bytes_speedup"])


def test_an_incomplete_report_is_refused_and_nothing_is_stored(
    api, user_token, worker_token
) -> None:
    created = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token)).json()
    build = created["builds"][0]
    first_cut_only = {"ops_total": 1, "op_counts": {}, "tile_ops": 0, "tile_output_bytes": 0,
                      "state_write_ops": 0, "weight_bytes": 1, "bytes_per_token": {"total": 1}}  # fmt: skip
    refused = start_and_complete(api, build, worker_token, build_report(build, first_cut_only))
    assert refused.status_code == 422
    assert ["body", "report", "analysis", "functions"] in [
        e["loc"] for e in refused.json()["detail"]
    ]
    stored = api.get(f"/api/v1/builds/{build['id']}", headers=bearer(user_token)).json()
    assert stored["state"] == "building" and stored["report"] is None
    assert stored["analysis"] is None


def test_diff_needs_two_analysed_builds(api, user_token, worker_token) -> None:
    created = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token)).json()
    a, b = created["builds"]
    queued = api.get(f"/api/v1/builds/{a['id']}/diff/{b['id']}", headers=bearer(user_token))
    assert queued.status_code == 409
    assert queued.json()["detail"] == f"build {a['id']} has no analysis yet (it is queued)"
    missing = api.get(f"/api/v1/builds/{a['id']}/diff/999", headers=bearer(user_token))
    assert missing.status_code == 404


def test_diff_page_is_linked_from_the_sweep(api, sweep, user_token) -> None:
    assert ui_sign_in(api, user_token).status_code == 303
    a, b = (build["id"] for build in sweep["builds"])
    sweep_page = api.get(f"/sweeps/{sweep['id']}").text
    assert f'href="/builds/{a}/diff/{b}"' in sweep_page

    page = api.get(f"/builds/{a}/diff/{b}")
    assert page.status_code == 200
    assert f"build {a}: tiny-gqa repeat_kv-ctx{CONTEXT}-fp16" in page.text
    assert f"Redundant copies only in A: {2 * LAYERS} ops, 2.00 MiB of tensors" in page.text
    assert "Redundant copies only in B: 0 ops" in page.text
    assert page.text.count("read_state key_cache_") == LAYERS
    assert 'id="bytes-speedup"' in page.text and 'data-category="redundant"' in page.text

    not_ready = api.get(f"/builds/{a}/diff/{a + 100}")
    assert not_ready.status_code == 404
