"""The sweep form: errors next to their field in plain words with 1-based rows, a class with
no device refused unless confirmed, every control labelled; the API refuses what the preset
already rules out."""

from __future__ import annotations

import html
import re

from tests.support.api import bearer
from tests.support.pages import page_csrf, ui_sign_in

BASE = {
    "model": "tiny-gqa", "variant0_attention": "repeat_kv", "variant0_context": "128",
    "variant0_quant": "fp16", "variant1_attention": "folded", "variant1_context": "128",
    "variant1_quant": "fp16", "devices": ["iphone-15-pro"], "prompts": "2",
    "decode_tokens": "8", "repetitions": "1",
}  # fmt: skip


def _post(api, **changes):
    token = page_csrf(api.get("/sweeps/new").text)
    return api.post("/sweeps/new", data={**BASE, **changes, "csrf_token": token})


def _field_error(page: str, field: str) -> str:
    control = re.search(rf'<[^>]*name="{field}"[^>]*>', page).group(0)
    assert 'aria-invalid="true"' in control and f'aria-describedby="error-{field}"' in control
    found = re.search(rf'<span class="field-error" id="error-{field}">([^<]*)</span>', page)
    return html.unescape(found.group(1))


def test_errors_sit_next_to_their_field_with_rows_from_one(api, user_token) -> None:
    ui_sign_in(api, user_token)
    page = _post(api, variant1_context="7", variant1_name="a b", confirm_unattached="1")
    assert page.status_code == 422
    assert (
        _field_error(page.text, "variant1_context") == "Input should be greater than or equal to 64"
    )
    assert _field_error(page.text, "variant1_name")
    assert 'id="error-variant0_context"' not in page.text
    # checks across fields run once every field is valid on its own
    page = _post(api, variant1_layers="99", confirm_unattached="1")
    assert _field_error(page.text, "variant1_layers") == (
        "Row 2's layers (99) is more than the 2 decoder layers tiny-gqa has"
    )
    assert 'value="99"' in page.text  # the form keeps what was typed


def test_top_k_beyond_the_layer_count_is_refused_in_the_form_and_the_api(api, user_token) -> None:
    ui_sign_in(api, user_token)
    page = _post(api, variant1_quant="top8", confirm_unattached="1")
    assert "promotes the top 8 layers but the model has 2" in _field_error(
        page.text, "variant1_quant"
    )
    spec = {
        "model": "tiny-gqa", "devices": ["iphone-17-pro"],
        "variants": [{"attention": "folded", "quant": "top8"}],
    }  # fmt: skip
    refused = api.post("/api/v1/sweeps", json=spec, headers=bearer(user_token))
    assert refused.status_code == 422 and "variants.0.quant" in refused.text
    spec["variants"] = [{"attention": "folded", "layers": 3}]
    refused = api.post("/api/v1/sweeps", json=spec, headers=bearer(user_token))
    assert refused.status_code == 422 and "variants.0.layers (3)" in refused.text


def test_a_class_with_no_ready_device_is_refused_unless_confirmed(api, user_token) -> None:
    ui_sign_in(api, user_token)
    form = api.get("/sweeps/new").text
    assert 'data-device-class="iphone-15-pro">(0 ready)' in form
    assert not re.search(r'value="iphone-15-pro" checked', form)  # nothing ready: not ticked
    refused = _post(api)
    assert refused.status_code == 422
    assert "No iPhone 15 Pro is attached and ready" in refused.text
    confirmed = _post(api, confirm_unattached="1")
    assert confirmed.url.path == "/sweeps/1"


def test_every_form_control_is_labelled(api, user_token) -> None:
    ui_sign_in(api, user_token)
    page = api.get("/sweeps/new").text
    controls = re.findall(r"<(?:input|select)\b[^>]*>", page)
    visible = [c for c in controls if 'type="hidden"' not in c]
    for control in visible:
        ident = re.search(r'id="([^"]+)"', control)
        labelled = (ident and f'for="{ident.group(1)}"' in page) or 'type="checkbox"' in control
        assert labelled, control
