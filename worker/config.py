"""The build worker's settings: the broker, the server's URL and a worker token, no database."""

from __future__ import annotations

import socket
from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class WorkerSettings(BaseSettings):
    """Read from ``DECODEBENCH_*`` environment variables when the worker starts."""

    model_config = SettingsConfigDict(env_prefix="DECODEBENCH_", extra="ignore")

    broker_url: str = "redis://127.0.0.1:6379/0"
    server_url: str = "http://127.0.0.1:8000"
    worker_token: SecretStr = Field(
        default=SecretStr(""), description="A worker token (python -m server.manage create-token)"
    )
    work_dir: Path = Path("var/worker")
    reconcile_interval_s: float = Field(
        default=60.0, gt=0, description="How often beat asks the server to recover lost builds"
    )
    schedule_tick_interval_s: float = Field(
        default=30.0, gt=0, description="How often beat asks the server to fire due schedules"
    )
    worker_name: str = Field(default_factory=socket.gethostname)
    report_patience_s: float = Field(
        default=1800.0,
        gt=0,
        description="How long a finished build keeps delivering its package and report to a "
        "server that is away (unreachable, or its database is: 503) before it gives up",
    )

    @field_validator("worker_token")
    @classmethod
    def _token_is_set(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value().strip():
            raise ValueError("DECODEBENCH_WORKER_TOKEN must be set to a worker token")
        return value

    @property
    def token(self) -> str:
        return self.worker_token.get_secret_value()

    @property
    def name(self) -> str:
        return self.worker_name


@lru_cache
def get_worker_settings() -> WorkerSettings:
    return WorkerSettings()
