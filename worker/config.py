"""Build workers need the broker, the server's URL and a worker token: no database access."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class WorkerSettings:
    broker_url: str = field(
        default_factory=lambda: os.environ.get("DECODEBENCH_BROKER_URL", "redis://127.0.0.1:6379/0")
    )
    server_url: str = field(
        default_factory=lambda: os.environ.get("DECODEBENCH_SERVER_URL", "http://127.0.0.1:8000")
    )
    token: str = field(default_factory=lambda: os.environ.get("DECODEBENCH_WORKER_TOKEN", ""))
    work_dir: Path = field(
        default_factory=lambda: Path(os.environ.get("DECODEBENCH_WORK_DIR", "var/worker"))
    )
    name: str = field(
        default_factory=lambda: os.environ.get("DECODEBENCH_WORKER_NAME", socket.gethostname())
    )
