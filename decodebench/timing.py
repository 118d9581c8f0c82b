"""The timing model of a stand-in iPhone: a memory-bound roofline plus a device-like noise model.

A step of the decode model costs `bytes_per_token / effective bandwidth` of the device profile
(decode is memory-bound; see decodebench.contracts.profiles), times the noise of the profile's
`DeviceNoise` (docs/noise-model.md), all seeded so a run reproduces exactly:

- a device offset, fixed per UDID (device-to-device spread);
- a run offset, drawn per (run, device) (run-to-run spread on one device);
- a thermal slow-down that grows over the run's sustained work towards the slow-down of the
  device's thermal state: ``1 + slowdown(state) * (1 - exp(-busy_s / time_constant))``;
- per-token log-normal jitter, and rare stalls (a token 5-20x slower).

`TimingParameters.noise_scale` multiplies every spread, slow-down and the stall rate; 0 leaves
the bare roofline. Its one owner for the simulated driver (agent), the emulated iPhone
(`emulator`) and the judge's simulated sweeps (`decodebench.judging.simulation`).
"""

from __future__ import annotations

import hashlib
import math
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from decodebench.contracts.profiles import DeviceNoise, DeviceProfile


@dataclass(frozen=True)
class TimingParameters:
    noise_scale: float = 1.0
    prefill_parallelism: float = 8.0
    cold_load_fixed_ms: float = 300.0
    cold_load_bytes_s: float = 250e6
    warm_load_fixed_ms: float = 30.0
    warm_load_bytes_s: float = 2e9
    runtime_overhead_bytes: int = 48 * 2**20

    def __post_init__(self) -> None:
        if not (math.isfinite(self.noise_scale) and 0 <= self.noise_scale <= 10):
            raise ValueError(f"noise_scale is {self.noise_scale!r}; it must be in [0, 10]")
        if self.prefill_parallelism <= 0:
            raise ValueError("prefill_parallelism must be positive")

    def cold_load_ms(self, package_bytes: int) -> float:
        return self.cold_load_fixed_ms + package_bytes / self.cold_load_bytes_s * 1000

    def warm_load_ms(self, package_bytes: int) -> float:
        return self.warm_load_fixed_ms + package_bytes / self.warm_load_bytes_s * 1000

    def peak_memory_bytes(self, package_bytes: int) -> int:
        return package_bytes + self.runtime_overhead_bytes


def decode_latency_s(profile: DeviceProfile, bytes_per_token: int, dispatch_ops: int = 0) -> float:
    """The roofline's seconds per token, the very formula predictions use."""
    return profile.seconds_per_token(bytes_per_token, dispatch_ops)


def _seed(*parts: object) -> int:
    key = ":".join(str(part) for part in parts).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big")


def prompt_seed(run_id: int, udid: str, prompt_index: int) -> int:
    return _seed(run_id, udid, prompt_index)


def _log_normal(seed: int, sigma: float) -> float:
    # Mean 1: the spread moves single values, not the average the roofline predicts.
    return math.exp(sigma * random.Random(seed).gauss(0.0, 1.0) - sigma**2 / 2)


class RunNoise:
    """The noise of one run on one device: fixed offsets, thermal drift and per-step draws."""

    def __init__(
        self, noise: DeviceNoise, scale: float, udid: str, run_id: int, thermal_state: str
    ) -> None:
        self.noise = noise
        self.scale = scale
        self.thermal_state = thermal_state
        self.device_factor = _log_normal(_seed("device", udid), noise.device_spread * scale)
        self.run_factor = _log_normal(_seed("run", run_id, udid), noise.run_spread * scale)

    @classmethod
    def for_run(
        cls,
        profile: DeviceProfile,
        timing: TimingParameters,
        udid: str,
        run_id: int,
        thermal_state: str = "nominal",
    ) -> RunNoise:
        return cls(profile.noise, timing.noise_scale, udid, run_id, thermal_state)

    @property
    def offset(self) -> float:
        return self.device_factor * self.run_factor

    def thermal_factor(self, busy_s: np.ndarray | float) -> np.ndarray:
        slowdown = self.noise.slowdown(self.thermal_state) * self.scale
        growth = 1 - np.exp(-np.asarray(busy_s, dtype=float) / self.noise.thermal_time_constant_s)
        return 1 + slowdown * growth

    def factors(
        self, rng: np.random.Generator, nominal_s: np.ndarray, busy_s: float = 0.0
    ) -> np.ndarray:
        """Latency multipliers of consecutive steps of nominal lengths `nominal_s`, the first
        starting after `busy_s` seconds of work in this run (thermal drift follows the
        nominal schedule, close enough for a slow drift)."""
        count = len(nominal_s)
        sigma = self.noise.token_jitter * self.scale
        jitter = np.exp(sigma * rng.standard_normal(count) - sigma**2 / 2)
        stalls = rng.random(count) < self.noise.outlier_rate * self.scale
        low, high = self.noise.outlier_factor
        stall = np.where(stalls, rng.uniform(low, high, count), 1.0)
        ends = np.cumsum(np.asarray(nominal_s, dtype=float) * self.offset)
        started = busy_s + np.concatenate(([0.0], ends[:-1]))
        return self.offset * self.thermal_factor(started) * jitter * stall

    def describe(self) -> str:
        noise, scale = self.noise, self.scale
        if scale == 0:
            return "no noise (noise_scale 0)"
        low, high = noise.outlier_factor
        return (
            f"noise x{scale:g} ({noise.source}): device offset {self.device_factor:.4f} "
            f"(sigma {noise.device_spread * scale:g}), run offset {self.run_factor:.4f} (sigma "
            f"{noise.run_spread * scale:g}), thermal slow-down towards "
            f"{noise.slowdown(self.thermal_state) * scale:.1%} ({self.thermal_state}, time "
            f"constant {noise.thermal_time_constant_s:g} s), per-token log-normal jitter sigma "
            f"{noise.token_jitter * scale:g}, stalls {low:g}-{high:g}x at rate "
            f"{noise.outlier_rate * scale:g} per token"
        )


class SimulatedRun(NamedTuple):
    noise: RunNoise
    prefill_s: np.ndarray  # (prompts,)
    latencies_s: np.ndarray  # (prompts, decode tokens)


def simulate_decode(
    profile: DeviceProfile,
    timing: TimingParameters,
    bytes_per_token: int,
    udid: str,
    run_id: int,
    prompt_tokens: Sequence[int],
    decode_tokens: int,
    thermal_state: str = "nominal",
    dispatch_ops: int = 0,
) -> SimulatedRun:
    """Prefill and per-token decode times of one run of the decode sweep, prompt after prompt.

    Prefill of a prompt is one step of `prompt tokens x decode latency / prefill_parallelism`
    (the weights are read once per batch of prompt tokens), with one noise factor.
    """
    if bytes_per_token <= 0:
        raise ValueError(f"bytes_per_token is {bytes_per_token}; the roofline needs it > 0")
    if decode_tokens < 1 or not prompt_tokens:
        raise ValueError("a run needs at least one prompt and one decode token")
    base_s = decode_latency_s(profile, bytes_per_token, dispatch_ops)
    noise = RunNoise.for_run(profile, timing, udid, run_id, thermal_state)
    prefill = np.asarray(prompt_tokens, dtype=float) * base_s / timing.prefill_parallelism
    nominal = np.column_stack([prefill, np.full((len(prefill), decode_tokens), base_s)])
    rng = np.random.default_rng(_seed("steps", run_id, udid))
    durations = nominal * noise.factors(rng, nominal.ravel()).reshape(nominal.shape)
    return SimulatedRun(noise, durations[:, 0], durations[:, 1:])


class RooflineClock:
    """A virtual clock and step engine in one: each step advances time by its roofline latency
    times the run's noise (prefill and decode steps alike, as the converted model steps both).

    `tokens`, when given, supplies the greedy tokens (a reference decoder); otherwise steps
    return None and the harness records no token ids.
    """

    def __init__(
        self,
        profile: DeviceProfile,
        bytes_per_token: int,
        noise: RunNoise,
        seed: int,
        tokens: TokenSource | None = None,
        dispatch_ops: int = 0,
    ) -> None:
        if bytes_per_token <= 0:
            raise ValueError(f"bytes_per_token is {bytes_per_token}; the roofline needs it > 0")
        self._latency_s = decode_latency_s(profile, bytes_per_token, dispatch_ops)
        self._noise = noise
        self._rng = np.random.default_rng(seed)
        self._tokens = tokens
        self._now_ns = 0

    def now_ns(self) -> int:
        return self._now_ns

    def reset(self) -> None:
        if self._tokens is not None:
            self._tokens.reset()

    def step(self, token: int, position: int) -> int | None:
        nominal = np.array([self._latency_s])
        factor = self._noise.factors(self._rng, nominal, self.elapsed_s)[0]
        self._now_ns += max(1, round(self._latency_s * factor * 1e9))
        return None if self._tokens is None else self._tokens.step(token, position)

    @property
    def elapsed_s(self) -> float:
        return self._now_ns / 1e9


class TokenSource:
    """Something that knows the model's greedy tokens; `lock` is held for a whole run, since
    its KV cache is state (see `emulator.reference`, `emulator.app`)."""

    source = "a token source"
    lock: threading.Lock

    def reset(self) -> None:
        raise NotImplementedError

    def step(self, token: int, position: int) -> int:
        raise NotImplementedError
