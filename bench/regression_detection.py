"""How well nightly regression detection works, measured on simulated nightly histories.

Each history is one series (one variant on one device class of a schedule) of `--nights`
nights on one device (a schedule keeps its device; a device swap is a change of its own). A
night's value is what a nightly sweep measures: the mean decode tok/s over 30 prompts × 32
tokens × `--repetitions` runs, each run drawn from the default noise model of the stand-in
devices (docs/noise-model.md) through `simulate_decode`, the simulated driver's own code. The
real detection code (decodebench.judging.nightly) judges every night; a suspected change gets a
confirmation re-run (a fresh sweep of the same build on the same night), and only a confirmed
change is an alert. Histories are seeded: the same arguments print the same figures.

- false alarms: confirmed alerts in histories without a change, per 100 judged nights;
- detection rate: share of histories with a step of 2%, 5% or 10% slower tok/s, starting at a
  random night, in which that regression is confirmed by the end of the history;
- nights to confirm: first bad night = night 1;
- re-run suspicions: clean nights that cost a confirmation re-run (dismissed unless an alarm).

    python bench/regression_detection.py --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from decodebench.contracts.profiles import IPHONE_17_PRO
from decodebench.judging import nightly
from decodebench.judging.simulation import SimulatedDesign, nightly_value
from decodebench.timing import TimingParameters

BYTES_PER_TOKEN = 1_400_000_000
STEPS = (0.02, 0.05, 0.10)
PROMPT_TOKENS = SimulatedDesign().prompt_tokens()


class History:
    """One simulated series and the detection's answers to it, night by night."""

    def __init__(self, args: argparse.Namespace, trial: int, step: float, seed: int) -> None:
        self.design = SimulatedDesign(repetitions=args.repetitions)
        self.timing = TimingParameters(noise_scale=args.noise_scale)
        self.settings = nightly.DetectionSettings(min_effect=args.min_effect)
        self.prompt_tokens = PROMPT_TOKENS
        rng = np.random.default_rng([seed, trial, round(step * 1000)])
        first = self.settings.min_history + 2
        self.step = step
        self.step_night = int(rng.integers(first, args.nights - 6)) if step else args.nights
        self.udid = f"sim-nightly-{seed}-{trial}-{round(step * 1000)}"
        self.next_run_id = 1
        self.suspicions: list[int] = []  # nights that needed a confirmation re-run

    def measure(self, night: int) -> float:
        # A step of s slower tok/s: the build moves 1 / (1 - s) times the bytes per token.
        slower = 1 / (1 - self.step) if night >= self.step_night else 1.0
        value = nightly_value(
            IPHONE_17_PRO,
            self.timing,
            self.design,
            round(BYTES_PER_TOKEN * slower),
            self.udid,
            self.next_run_id,
            self.prompt_tokens,
        )
        self.next_run_id += self.design.repetitions
        return value

    def run(self, nights: int) -> list[tuple[int, nightly.Direction]]:
        """Confirmed alerts as (night, direction)."""
        active: list[float] = []
        alerts = []
        for night in range(nights):
            active.append(self.measure(night))
            suspect = nightly.suspect_change(active, self.settings)
            if suspect is None:
                continue
            self.suspicions.append(night)
            confirmation = nightly.confirm_change(suspect, [self.measure(night)], self.settings)
            if confirmation.outcome is nightly.Outcome.confirmed:
                alerts.append((night, suspect.direction))
            active = nightly.series_after(active, confirmation)
        return alerts


def main() -> None:
    parser = argparse.ArgumentParser(description="Measure nightly regression detection.")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--nights", type=int, default=60)
    parser.add_argument("--trials", type=int, default=150, help="histories per condition")
    parser.add_argument("--repetitions", type=int, default=2, help="runs per nightly sweep")
    parser.add_argument("--noise-scale", type=float, default=1.0)
    parser.add_argument("--min-effect", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()
    started = time.monotonic()
    settings = nightly.DetectionSettings(min_effect=args.min_effect)

    false_alarms, judged_nights, clean_suspicions = 0, 0, 0
    detection: dict[str, float] = {}
    nights_to_confirm: dict[str, float | None] = {}
    for step in (0.0, *STEPS):
        delays = []
        for trial in range(args.trials):
            history = History(args, trial, step, args.seed)
            alerts = history.run(args.nights)
            clean_nights = min(history.step_night, args.nights)
            judged_nights += max(0, clean_nights - settings.min_history)
            false_alarms += sum(night < history.step_night for night, _ in alerts)
            clean_suspicions += sum(night < history.step_night for night in history.suspicions)
            confirmed = [
                night
                for night, direction in alerts
                if night >= history.step_night and direction is nightly.Direction.regression
            ]
            if step and confirmed:
                delays.append(confirmed[0] - history.step_night + 1)
        if step:
            key = f"{step * 100:g}"
            detection[key] = len(delays) / args.trials
            nights_to_confirm[key] = statistics.median(delays) if delays else None

    report = {
        "nights": args.nights,
        "trials": args.trials,
        "repetitions_per_night": args.repetitions,
        "noise_scale": args.noise_scale,
        "min_effect": args.min_effect,
        "judged_clean_nights": judged_nights,
        "false_alarms": false_alarms,
        "false_alarms_per_100_nights": round(100 * false_alarms / max(judged_nights, 1), 3),
        "rerun_suspicions_per_100_clean_nights": round(
            100 * clean_suspicions / max(judged_nights, 1), 3
        ),
        "detection_rate": detection,
        "median_nights_to_confirm": nights_to_confirm,
        "seconds": round(time.monotonic() - started, 1),
        "simulated": True,
    }
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>28}: {value}")


if __name__ == "__main__":
    main()
