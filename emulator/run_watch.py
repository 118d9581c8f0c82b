"""What the emulated harness watches around the timed steps, by the phone's definitions.

The same quantities as ``ios_harness`` (``decodebench.harness``), from stated models instead of
``task_info`` and ``ProcessInfo``:

- memory: the footprint sampled after every step of the timed prompts is runtime overhead +
  weights (the package's bytes) + the KV cache (2 x layers x KV heads x context x head_dim x
  2 bytes, from the model's preset when it has one); the compile peak is runtime overhead + 2 x
  the package's bytes (the source and its compiled copy);
- thermal state: the device's condition, sampled after every prompt; nothing cools an emulated
  phone, so one that is not nominal waits the job's whole ``thermal_wait_s`` (virtual time);
- interruptions: an armed ``interrupt`` fault makes the app leave the foreground after the
  first step of the middle prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from decodebench.contracts.results import PromptResult, ThermalState
from decodebench.harness import HarnessJob, RunInterrupted
from emulator.faults import FaultKind
from emulator.reference import resolve_config

if TYPE_CHECKING:
    from emulator.device import EmulatedDevice

FP16_BYTES = 2


def kv_cache_bytes(job: HarnessJob) -> int | None:
    """Bytes of the fp16 KV cache of the job's model, or None when its shape is not known."""
    if job.variant is None:
        return None
    try:
        config = resolve_config(job.model, job.variant)
    except KeyError:
        return None
    per_layer = 2 * config.num_key_value_heads * job.context_tokens * config.head_dim
    return config.num_layers * per_layer * FP16_BYTES


@dataclass(frozen=True)
class Footprint:
    runtime_bytes: int
    weights_bytes: int
    kv_bytes: int | None

    @classmethod
    def of(cls, job: HarnessJob, package_bytes: int, runtime_bytes: int) -> Footprint:
        return cls(runtime_bytes, package_bytes, kv_cache_bytes(job))

    def sample(self) -> int:
        return self.runtime_bytes + self.weights_bytes + (self.kv_bytes or 0)

    @property
    def compile_peak_bytes(self) -> int:
        return self.runtime_bytes + 2 * self.weights_bytes

    def describe(self) -> str:
        kv = (
            f"KV cache {self.kv_bytes:,} B (2 x layers x KV heads x context x head_dim x 2 B)"
            if self.kv_bytes is not None
            else "KV cache unknown (no preset), counted as 0"
        )
        return (
            f"memory (a stated model, not measured): footprint sampled after every timed step = "
            f"runtime {self.runtime_bytes / 2**20:g} MiB + weights {self.weights_bytes:,} B "
            f"(package bytes) + {kv}; compile peak = runtime + 2 x package bytes"
        )


def thermal_wait_ms(state: ThermalState, limit_s: float) -> float:
    return 0.0 if state == ThermalState.nominal else limit_s * 1000


class EmulatedObserver:
    """decodebench.harness.SweepObserver for the emulated harness."""

    def __init__(self, device: EmulatedDevice, job: HarnessJob, footprint: Footprint) -> None:
        self._device = device
        self._job = job
        self._footprint = footprint
        self.decode_peak_bytes = 0
        self.thermal_samples: list[ThermalState] = []
        self._prompt = 0
        self._steps_in_prompt = 0
        interrupted = device.faults.take(FaultKind.interrupt)
        self._interrupt_at = len(job.prompts) // 2 if interrupted else None

    def after_step(self) -> None:
        self.decode_peak_bytes = max(self.decode_peak_bytes, self._footprint.sample())
        self._steps_in_prompt += 1
        if self._interrupt_at == self._prompt and self._steps_in_prompt == 1:
            index = self._job.prompts[self._prompt].index
            raise RunInterrupted(
                f"the app left the foreground (resign active) during prompt {index}"
            )

    def after_prompt(self, result: PromptResult) -> PromptResult:
        self.thermal_samples.append(self._device.condition.thermal_state)
        self._prompt += 1
        self._steps_in_prompt = 0
        return result
