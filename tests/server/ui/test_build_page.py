"""A build's page: its analysis drawn and listed, its artifact, a picker for a diff."""

from __future__ import annotations

from tests.support.api import bearer, complete_build
from tests.support.pages import ui_sign_in

SWEEP = {
    "model": "tiny-gqa",
    "variants": [{"attention": "repeat_kv", "context": 128}, {"attention": "folded", "context": 128}],
    "devices": ["iphone-17-pro"],
    "prompts": 2,
}  # fmt: skip
COPY = {
    "kind": "tile", "op": "tile", "name": "k_rep_0", "function": "main", "shape": [1, 4, 128, 16],
    "dtype": "fp16", "bytes": 16384, "moved_bytes": 32768, "source_op": "read_state",
    "source": "key_cache_0",
}  # fmt: skip


def test_build_page_lists_redundant_copies_and_offers_a_diff(api, user_token, worker_token) -> None:
    created = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token)).json()
    repeat, folded = created["builds"]
    complete_build(
        api,
        repeat,
        worker_token,
        {"redundant_ops": [COPY], "op_counts": {"tile": 1, "matmul": 4}, "ops_total": 5},
    )
    complete_build(api, folded, worker_token, {"op_counts": {"matmul": 4}})
    ui_sign_in(api, user_token)
    page = api.get(f"/builds/{repeat['id']}")
    assert page.status_code == 200
    rows = page.text.split('id="redundant-ops"')[1].split("</table>")[0]
    assert rows.count("<tr>") == 2  # the header and one copy
    assert "1×4×128×16" in rows and "16,384" in rows and "key_cache_0" in rows
    assert page.text.count('class="bar"') == 2  # the op histogram: tile and matmul
    assert f'<option value="{folded["id"]}">build {folded["id"]} · folded-ctx128-fp16' in page.text
    assert f'href="/builds/{repeat["id"]}/download"' in page.text

    picked = api.get(
        f"/builds/{repeat['id']}/diff", params={"other": folded["id"]}, follow_redirects=False
    )
    assert picked.status_code == 303, picked.text[:3000]
    assert picked.headers["location"] == f"/builds/{repeat['id']}/diff/{folded['id']}"
    download = api.get(f"/builds/{repeat['id']}/download")
    assert download.status_code == 200 and download.content == repeat["key"].encode()
    assert "No redundant copies" in api.get(f"/builds/{folded['id']}").text
    assert api.get("/builds/999").status_code == 404
