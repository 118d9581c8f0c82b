"""The roofline timing model of a fake iPhone: decode is memory-bound (docs/device-profiles.md).

A step of the decode model costs `bytes_per_token / effective bandwidth` of the device profile,
times a small seeded jitter. Used by the simulated driver (agent) and the emulated iPhone.
"""

from __future__ import annotations

import hashlib
import random
import threading
from dataclasses import dataclass

from decodebench.profiles import DeviceProfile


@dataclass(frozen=True)
class TimingParameters:
    jitter: float = 0.03
    prefill_parallelism: float = 8.0
    cold_load_fixed_ms: float = 300.0
    cold_load_bytes_s: float = 250e6
    warm_load_fixed_ms: float = 30.0
    warm_load_bytes_s: float = 2e9
    runtime_overhead_bytes: int = 48 * 2**20

    def __post_init__(self) -> None:
        if not 0 <= self.jitter < 1:
            raise ValueError("jitter must be in [0, 1)")
        if self.prefill_parallelism <= 0:
            raise ValueError("prefill_parallelism must be positive")

    def cold_load_ms(self, package_bytes: int) -> float:
        return self.cold_load_fixed_ms + package_bytes / self.cold_load_bytes_s * 1000

    def warm_load_ms(self, package_bytes: int) -> float:
        return self.warm_load_fixed_ms + package_bytes / self.warm_load_bytes_s * 1000

    def peak_memory_bytes(self, package_bytes: int) -> int:
        return package_bytes + self.runtime_overhead_bytes


def decode_latency_s(profile: DeviceProfile, bytes_per_token: int) -> float:
    return 1.0 / profile.predicted_tok_s(bytes_per_token)


def prompt_seed(run_id: int, udid: str, prompt_index: int) -> int:
    key = f"{run_id}:{udid}:{prompt_index}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big")


class RooflineClock:
    """A virtual clock and step engine in one: each step advances time by its roofline latency.

    `tokens`, when given, supplies the greedy tokens (a reference decoder); otherwise steps
    return None and the harness records no token ids.
    """

    def __init__(
        self,
        profile: DeviceProfile,
        bytes_per_token: int,
        seed: int,
        jitter: float,
        tokens: TokenSource | None = None,
    ) -> None:
        if bytes_per_token <= 0:
            raise ValueError(f"bytes_per_token is {bytes_per_token}; the roofline needs it > 0")
        self._latency_ns = decode_latency_s(profile, bytes_per_token) * 1e9
        self._rng = random.Random(seed)
        self._jitter = jitter
        self._tokens = tokens
        self._now_ns = 0

    def now_ns(self) -> int:
        return self._now_ns

    def reset(self) -> None:
        if self._tokens is not None:
            self._tokens.reset()

    def step(self, token: int, position: int) -> int | None:
        factor = self._rng.uniform(1 - self._jitter, 1 + self._jitter)
        self._now_ns += max(1, round(self._latency_ns * factor))
        return None if self._tokens is None else self._tokens.step(token, position)

    @property
    def elapsed_s(self) -> float:
        return self._now_ns / 1e9


class TokenSource:
    """Something that knows the model's greedy tokens; `lock` is held for a whole run, since
    its KV cache is state (see `decodebench.emulated.reference`, `decodebench.emulated.app`)."""

    source = "a token source"
    lock: threading.Lock

    def reset(self) -> None:
        raise NotImplementedError

    def step(self, token: int, position: int) -> int:
        raise NotImplementedError
