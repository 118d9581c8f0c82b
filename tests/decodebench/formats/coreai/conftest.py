"""Core AI assets of the tiny GQA preset (32 query heads over 8 KV heads, 2 layers, context
64), built once per session with coreai-torch: repeat_kv and folded, fp16."""

from __future__ import annotations

from pathlib import Path

import pytest

from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.presets import get_preset

CONTEXT = 64


@pytest.fixture(scope="session")
def coreai_assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from decodebench.formats.coreai.convert import convert_preset

    root = tmp_path_factory.mktemp("coreai")
    config = get_preset("tiny-gqa")
    assets = {}
    for attention in ("repeat_kv", "folded"):
        variant = VariantSpec(format="coreai", attention=attention, context=CONTEXT)
        assets[attention] = convert_preset(config, variant, root / f"{attention}.aimodel")
    return assets
