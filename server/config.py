"""One settings object for the server role, read from DECODEBENCH_* environment variables."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from decodebench import __version__
from decodebench.toolchain import CODE_KEY, installed_code

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/decodebench"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DECODEBENCH_", extra="ignore")

    environment: str = "development"
    database_url: str = DEFAULT_DATABASE_URL
    broker_url: str = "redis://127.0.0.1:6379/0"
    artifact_dir: Path = Path("var/artifacts")
    public_url: str = "http://127.0.0.1:8000"
    lease_seconds: int = 120
    heartbeat_interval_s: float = 5.0
    max_run_attempts: int = 3
    max_build_attempts: int = 2
    # A worker renews its build's lease every third of this; a build whose lease ran out is
    # queued again by the reconciler (beat, every minute), so a killed worker costs at most
    # this plus a minute.
    build_lease_seconds: float = 120.0
    # Doctor jobs are leased like builds, with settings of their own (the same defaults).
    max_doctor_attempts: int = 2
    doctor_lease_seconds: float = 120.0
    # A queued build no worker has started for this long is sent to the broker again.
    requeue_after_seconds: float = 120.0
    # Builds are keyed by the toolchain that makes them; workers refuse to build for another one.
    toolchain_coremltools: str = "9.0"
    toolchain_torch: str = "2.13.0"
    # A Core AI build is keyed by torch and these (decodebench.toolchain.FORMAT_TOOLCHAINS).
    toolchain_coreai_core: str = "1.0.0b3"
    toolchain_coreai_torch: str = "0.4.3"
    toolchain_coreai_opt: str = "0.4.0"
    # Database connections per server process; a request waits at most the pool timeout for
    # one, then gets 503 with Retry-After (docs: README "Under load and faults").
    db_pool_size: int = Field(default=8, ge=1, le=100)
    db_max_overflow: int = Field(default=4, ge=0, le=100)
    db_pool_timeout_s: float = Field(default=5.0, gt=0, le=60)
    retry_after_s: int = Field(default=2, ge=1, le=60)
    # The database on another host: a connection attempt gives up after this long, and an open
    # connection whose peer stops answering (a cut link, not a refusal) is dropped after
    # db_network_timeout_s (TCP user timeout and keepalives), so a request gets its 503 with
    # Retry-After instead of waiting for the kernel's retransmissions (about 15 minutes).
    db_connect_timeout_s: int = Field(default=5, ge=2, le=60)
    db_network_timeout_s: int = Field(default=10, ge=2, le=300)
    # Server processes `python -m server` starts (uvicorn workers); none keeps state in memory.
    workers: int = Field(default=1, ge=1, le=32)
    # Refused with 413 while the body streams in, before it is parsed.
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    max_artifact_bytes: int = Field(default=4 * 1024**3, ge=1024)
    # Models users bring (docs: README "Bring your own model"): one file of an upload, the
    # files of one model together (a zipped package: once unpacked), and one chunk's body.
    max_upload_bytes: int = Field(default=8 * 1024**3, ge=1024)
    max_model_bytes: int = Field(default=16 * 1024**3, ge=1024)
    max_upload_chunk_bytes: int = Field(default=64 * 1024**2, ge=1024)
    # The web UI: a signed-in browser's session lasts this long; this many refused sign-ins
    # from one client address within the window answer 429 until the oldest one ages out.
    ui_session_hours: float = 12.0
    sign_in_failures_allowed: int = 10
    sign_in_window_seconds: float = 300.0
    # A queued run whose device class has no device attached (or none seen) fails after this
    # long with the reason instead of waiting forever.
    unschedulable_wait_seconds: float = 1800.0
    # Fair share between sweeps (server/runs/queue.py): a sweep that got no device for this
    # long weighs twice its priority's weight, so none starves.
    fair_share_aging_s: float = Field(default=300.0, gt=0)
    # A long-poll claim re-checks the queue this often when no notification arrives (the
    # fallback should the notification listener be down).
    claim_fallback_poll_s: float = Field(default=5.0, gt=0, le=60)

    @model_validator(mode="after")
    def _production_needs_real_services(self) -> Settings:
        if self.environment == "production" and self.database_url == DEFAULT_DATABASE_URL:
            raise ValueError("DECODEBENCH_DATABASE_URL must be set explicitly in production")
        return self

    @property
    def libpq_timeouts(self) -> dict[str, int]:
        """libpq connection parameters that bound how long a lost database can hold a request."""
        network = self.db_network_timeout_s
        return {
            "connect_timeout": self.db_connect_timeout_s,
            "tcp_user_timeout": network * 1000,
            "keepalives": 1,
            "keepalives_idle": max(1, network // 2),
            "keepalives_interval": max(1, network // 4),
            "keepalives_count": 2,
        }

    @property
    def toolchain(self) -> dict[str, str]:
        """Every format's packages; a build is keyed by its format's part of it
        (:func:`decodebench.toolchain.format_toolchain`)."""
        return {
            "decodebench": __version__,
            "coremltools": self.toolchain_coremltools,
            "torch": self.toolchain_torch,
            "coreai-core": self.toolchain_coreai_core,
            "coreai-torch": self.toolchain_coreai_torch,
            "coreai-opt": self.toolchain_coreai_opt,
            CODE_KEY: installed_code(),
        }


@lru_cache
def get_settings() -> Settings:
    return Settings()
