"""One toolchain identity: the worker's own build key equals the key the server assigned."""

from __future__ import annotations

import pytest

from decodebench.contracts.domain import VariantSpec, build_key
from decodebench.toolchain import (
    ToolchainMismatch,
    check_toolchain,
    installed_toolchain,
    toolchain_identity,
)
from server.config import Settings


def test_local_version_labels_do_not_change_the_identity() -> None:
    assert toolchain_identity({"torch": "2.13.0+cpu", "coremltools": "9.0"}) == {
        "torch": "2.13.0",
        "coremltools": "9.0",
    }


def test_the_server_and_this_host_key_a_build_alike() -> None:
    server_toolchain = Settings().toolchain
    installed = installed_toolchain()
    check_toolchain(server_toolchain, installed)
    variant = VariantSpec()
    assert build_key("tiny-gqa", variant, server_toolchain) == build_key(
        "tiny-gqa", variant, installed
    )


def test_another_release_is_refused_by_name() -> None:
    with pytest.raises(ToolchainMismatch, match="build expects coremltools 8.3, this host has 9.0"):
        check_toolchain({"coremltools": "8.3"}, {"coremltools": "9.0"})
