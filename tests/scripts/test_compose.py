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


# -- the compose file, the operator guide and scripts/topology.py name the same farm ------------

# Compose settings the topology does not pass, and why.
COMPOSE_ONLY = {
    # the topology is a test farm reached over plain HTTP at its own addresses; production
    # marks the web UI's cookies secure
    "DECODEBENCH_ENVIRONMENT",
}
# the shared anchor gives the server the server's URL too; the server does not read it
COMPOSE_ONLY_FOR = {"server": {"DECODEBENCH_SERVER_URL"}}


def _guide_roles() -> list[tuple[str, str, set[str]]]:
    """The operator guide's roles table: (role, host, settings) in start order."""
    text = (ROOT / "docs" / "guides" / "operators.md").read_text()
    table = text.split("<!-- roles-table")[1].split("<!-- /roles-table -->")[0]
    rows = []
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].isdigit():
            settings = {name.strip(" `") for name in cells[3].split(",") if name.strip()}
            rows.append((int(cells[0]), cells[1], cells[2], settings))
    assert [row[0] for row in rows] == list(range(1, len(rows) + 1))
    return [row[1:] for row in rows]


def test_topology_compose_and_guide_name_the_same_roles_settings_and_order() -> None:
    from scripts.topology import HOST_OF_ROLE, START_ORDER, Topology

    settings = Topology().role_settings()
    guide = _guide_roles()
    assert [role for role, _, _ in guide] == list(START_ORDER)
    for role, host, named in guide:
        assert host == HOST_OF_ROLE[role], role
        assert named == settings.get(role, set()), role

    services = load()["services"]
    assert set(services) == set(START_ORDER) - {"agent"}  # agents run on the hosts with phones
    for role, service in services.items():
        environment = set(service.get("environment", {}))
        if role in ("postgres", "redis"):
            continue
        allowed = COMPOSE_ONLY | COMPOSE_ONLY_FOR.get(role, set())
        assert environment - allowed == settings[role], role
        # compose starts a role after what it depends on, as the topology and the guide do
        for dependency in service.get("depends_on", {}):
            assert START_ORDER.index(dependency) < START_ORDER.index(role), (role, dependency)


def test_the_guide_deploys_the_roles_in_start_order() -> None:
    from scripts.topology import START_ORDER

    text = (ROOT / "docs" / "guides" / "operators.md").read_text()
    block = text.split("## Deploying the roles")[1].split("```sh")[1].split("```")[0]
    commands = {
        "server": "python -m server --",
        "worker": "worker.app worker",
        "beat": "worker.app beat",
        "agent": "python -m agent",
    }
    lines = block.splitlines()
    first = {
        role: next(i for i, line in enumerate(lines) if command in line)
        for role, command in commands.items()
    }
    assert sorted(first, key=first.__getitem__) == [r for r in START_ORDER if r in commands]
    prestart = next(i for i, line in enumerate(lines) if "server.manage prestart" in line)
    assert prestart < first["server"]
