"""A nightly schedule's spec, and the first night it fires on (a settable clock drives the tick)."""

from __future__ import annotations

from datetime import datetime

NIGHTLY_SPEC = {
    "model": "tiny-gqa",
    "variants": [{"attention": "folded"}],
    "devices": ["iphone-17-pro"],
    "prompts": 4,
    "decode_tokens": 4,
    "repetitions": 2,
}
FIRST_NIGHT = datetime.fromisoformat("2027-01-01T02:01:00+00:00")
