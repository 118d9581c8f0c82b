"""docker compose cannot run here, so the file is checked by reading it."""

from __future__ import annotations

import importlib

import pytest
import yaml

from tests.support.paths import ROOT


def load() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_defines_every_service_role() -> None:
    assert set(load()["services"]) == {"postgres", "redis", "server", "worker", "beat"}


def test_commands_name_modules_that_exist(monkeypatch) -> None:
    monkeypatch.setenv("DECODEBENCH_WORKER_TOKEN", "compose-test")
    services = load()["services"]
    server_command = " ".join(services["server"]["command"])
    assert "python -m server.manage prestart" in server_command
    assert "python -m server --host 0.0.0.0" in server_command
    for module in ("server.manage", "server.__main__", "worker.app"):
        importlib.import_module(module)
    for role in ("worker", "beat"):
        command = services[role]["command"]
        assert command[:3] == ["celery", "-A", "worker.app"]
        assert command[3] == role


def test_roles_share_the_database_and_broker_settings() -> None:
    services = load()["services"]
    urls = {
        services[role]["environment"]["DECODEBENCH_BROKER_URL"]
        for role in ("server", "worker", "beat")
    }
    assert urls == {"redis://redis:6379/0"}
    assert "postgres:5432" in services["server"]["environment"]["DECODEBENCH_DATABASE_URL"]
    for role in ("worker", "beat"):  # the server is the only writer to the database
        assert "DECODEBENCH_DATABASE_URL" not in services[role]["environment"]
    assert services["server"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_dockerfile_copies_every_role() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    for folder in ("decodebench", "server", "worker", "agent", "migrations"):
        assert f"COPY {folder} {folder}" in dockerfile


def test_the_server_image_installs_without_the_build_toolchain() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "ARG EXTRAS=server" in dockerfile and ".[${EXTRAS}]" in dockerfile
    services = load()["services"]
    assert services["server"]["build"] == "."  # the default: the server extra only
    for role in ("worker", "beat"):
        assert services[role]["build"]["args"]["EXTRAS"] == "worker"


def test_a_worker_without_a_token_refuses_to_start(monkeypatch) -> None:
    from pydantic import ValidationError

    from worker.config import WorkerSettings

    monkeypatch.setenv("DECODEBENCH_WORKER_TOKEN", "  ")
    with pytest.raises(ValidationError, match="DECODEBENCH_WORKER_TOKEN must be set"):
        WorkerSettings()
    monkeypatch.setenv("DECODEBENCH_WORKER_TOKEN", "secret-token")
    settings = WorkerSettings()
    assert settings.token == "secret-token" and "secret-token" not in repr(settings)
