"""How well nightly regression detection works, measured on simulated nightly histories.

Each history is one series (one variant on one device class of a schedule) of `--nights`
nights on one device (a schedule keeps its device; a device swap is a change of its own). A
run's value is what the harness measures: the mean decode tok/s over 30 prompts × 32 tokens,
drawn from the noise model of the stand-in devices (docs/noise-model.md) scaled by
`--noise-scale`, through `simulate_decode`, the simulated driver's own code. Histories are
seeded: the same arguments print the same figures.

Two detectors judge the same kind of histories:

- `window` (what schedules did before issue 28): `--repetitions` runs a night, E-divisive over
  the trailing 30 nights, a change must start in the newest 2 nights, one confirmation re-run
  (decodebench.judging.nightly);
- `adaptive` (decodebench.judging.adaptive): nights start with `--repetitions` runs and add
  rounds up to `--budget` runs while they cannot decide at min_effect; shifts are looked for over
  the whole active series with the spread learned from the history's own runs; a suspected shift
  is confirmed by interleaved re-runs of the first bad and last good builds, from the nights'
  budgets, before it is an alert.

Figures:

- false alarms: confirmed alerts in histories without a change, per 100 judged nights;
- detection rate: share of histories with a step of 2%, 5% or 10% slower tok/s, starting at a
  random night, in which that regression is confirmed by the end of the history;
- nights to confirm: first bad night = night 1;
- runs per night: every run the series cost (nightly, added rounds, re-runs of both builds),
  averaged over every night of every history;
- CPU seconds per 1,000 simulated runs and the load average, as the machine is shared.

    python -m bench.regression_detection --json                  # one condition
    python -m bench.regression_detection --table --trials 150    # scales 1, 3, 5, both detectors
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import UTC, datetime

import numpy as np

from decodebench.contracts.profiles import IPHONE_17_PRO
from decodebench.contracts.schedules import DEFAULT_BUDGET
from decodebench.judging import adaptive, nightly
from decodebench.judging.simulation import SimulatedDesign, nightly_value
from decodebench.timing import TimingParameters

BYTES_PER_TOKEN = 1_400_000_000
STEPS = (0.02, 0.05, 0.10)
PROMPT_TOKENS = SimulatedDesign().prompt_tokens()
ONE_RUN = SimulatedDesign(repetitions=1)


class History:
    """One simulated series and the detection's answers to it, night by night."""

    def __init__(self, args: argparse.Namespace, trial: int, step: float) -> None:
        self.args = args
        self.timing = TimingParameters(noise_scale=args.noise_scale)
        rng = np.random.default_rng([args.seed, trial, round(step * 1000)])
        first = 8 + 2
        self.step = step
        self.step_night = int(rng.integers(first, args.nights - 6)) if step else args.nights
        self.udid = f"sim-nightly-{args.seed}-{trial}-{round(step * 1000)}"
        self.next_run_id = 1
        self.runs = 0
        self.suspicions: list[int] = []  # nights a suspicion was raised

    def bytes_at(self, night: int) -> int:
        # A step of s slower tok/s: the build moves 1 / (1 - s) times the bytes per token.
        slower = 1 / (1 - self.step) if night >= self.step_night else 1.0
        return round(BYTES_PER_TOKEN * slower)

    def measure(self, night: int, runs: int) -> list[float]:
        """`runs` runs of the build of `night` (each its mean decode tok/s over the prompts)."""
        values = []
        for _ in range(runs):
            values.append(
                nightly_value(
                    IPHONE_17_PRO,
                    self.timing,
                    ONE_RUN,
                    self.bytes_at(night),
                    self.udid,
                    self.next_run_id,
                    PROMPT_TOKENS,
                )
            )
            self.next_run_id += 1
        self.runs += runs
        return values

    def run(self, nights: int) -> list[tuple[int, nightly.Direction]]:
        raise NotImplementedError


class WindowHistory(History):
    """The trailing-window detector: a change must be seen in the newest nights."""

    def run(self, nights: int) -> list[tuple[int, nightly.Direction]]:
        settings = nightly.DetectionSettings(min_effect=self.args.min_effect)
        active: list[float] = []
        alerts = []
        for night in range(nights):
            active.append(float(np.mean(self.measure(night, self.args.repetitions))))
            suspect = nightly.suspect_change(active, settings)
            if suspect is None:
                continue
            self.suspicions.append(night)
            rerun = float(np.mean(self.measure(night, self.args.repetitions)))
            confirmation = nightly.confirm_change(suspect, [rerun], settings)
            if confirmation.outcome is nightly.Outcome.confirmed:
                alerts.append((night, suspect.direction))
            active = nightly.series_after(active, confirmation)
        return alerts


class AdaptiveHistory(History):
    """Adaptive repetitions, shifts over the whole series, interleaved confirmation."""

    def run(self, nights: int) -> list[tuple[int, nightly.Direction]]:
        settings = adaptive.AdaptiveSettings(
            min_effect=self.args.min_effect,
            base_runs=self.args.repetitions,
            budget=self.args.budget,
        )
        every: list[list[float]] = []  # every night's runs: the spread is learned from them
        active: list[list[float]] = []  # since the last confirmed change
        offset = 0  # night of active[0]
        ignored: dict[int, int] = {}  # cut (in active) -> night until which it is skipped
        pending: tuple[adaptive.Shift, list[float], list[float], int] | None = None
        alerts = []
        for night in range(nights):
            runs = self.measure(night, settings.base_runs)
            if pending is None and len(every) >= 2:
                spread = adaptive.estimate_spread(every)
                while (
                    adaptive.night_call(active, runs, spread, settings).call
                    is adaptive.NightCall.more
                ):
                    runs += self.measure(
                        night, min(settings.round_runs, settings.budget - len(runs))
                    )
            spent = len(runs)
            every.append(runs)
            active.append(runs)
            if len(every) < 2:
                continue
            spread = adaptive.estimate_spread(every)
            if pending is None:
                skip = [cut for cut, until in ignored.items() if until > night]
                shift = adaptive.find_shift(active, spread, settings, skip)
                if shift is None:
                    continue
                self.suspicions.append(night)
                pending = (shift, [], [], 0)
            shift, candidate, reference, taken = pending
            taken += 1
            # The newest night's build against one well inside the level before the cut, so
            # a cut placed a night or two off still compares the two levels.
            first_bad, last_good = night, offset + max(0, shift.index - 3)
            judgement = adaptive.judge_confirmation(
                shift, candidate, reference, spread, settings, taken
            )
            while spent + 4 <= settings.budget and judgement.call is adaptive.ConfirmationCall.open:
                # A B B A: candidate, reference, reference, candidate.
                candidate += self.measure(first_bad, 1)
                reference += self.measure(last_good, 2)
                candidate += self.measure(first_bad, 1)
                spent += 4
                judgement = adaptive.judge_confirmation(
                    shift, candidate, reference, spread, settings, taken
                )
            call = judgement.call
            if call is adaptive.ConfirmationCall.open and taken >= settings.confirm_nights:
                call = adaptive.ConfirmationCall.budget_spent
            if call is adaptive.ConfirmationCall.open:
                pending = (shift, candidate, reference, taken)
                continue
            pending = None
            if call is adaptive.ConfirmationCall.confirmed:
                direction = (
                    nightly.Direction.improvement
                    if shift.relative_change > 0
                    else nightly.Direction.regression
                )
                alerts.append((night, direction))
                active, offset, ignored = active[shift.index :], offset + shift.index, {}
            elif call is adaptive.ConfirmationCall.dismissed:
                ignored[shift.index] = nights
            else:
                ignored[shift.index] = night + settings.confirm_nights
        return alerts


def condition(args: argparse.Namespace) -> dict:
    """Every history of one (detector, noise scale, repetitions, budget)."""
    kind = AdaptiveHistory if args.detector == "adaptive" else WindowHistory
    started, cpu = time.monotonic(), time.process_time()
    false_alarms, judged_nights, clean_suspicions, runs, nights = 0, 0, 0, 0, 0
    detection: dict[str, float] = {}
    nights_to_confirm: dict[str, float | None] = {}
    for step in (0.0, *STEPS):
        delays = []
        for trial in range(args.trials):
            history = kind(args, trial, step)
            alerts = history.run(args.nights)
            runs += history.runs
            nights += args.nights
            clean_nights = min(history.step_night, args.nights)
            judged_nights += max(0, clean_nights - 8)
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
            detection[key] = round(len(delays) / args.trials, 3)
            nights_to_confirm[key] = statistics.median(delays) if delays else None
    cpu_s = time.process_time() - cpu
    return {
        "detector": args.detector,
        "nights": args.nights,
        "trials": args.trials,
        "seed": args.seed,
        "repetitions_per_night": args.repetitions,
        "budget": args.budget if args.detector == "adaptive" else None,
        "noise_scale": args.noise_scale,
        "min_effect": args.min_effect,
        "judged_clean_nights": judged_nights,
        "false_alarms": false_alarms,
        "false_alarms_per_100_nights": round(100 * false_alarms / max(judged_nights, 1), 3),
        "suspicions_per_100_clean_nights": round(100 * clean_suspicions / max(judged_nights, 1), 3),
        "detection_rate": detection,
        "median_nights_to_confirm": nights_to_confirm,
        "runs_per_night": round(runs / nights, 2),
        "simulated_runs": runs,
        "cpu_ms_per_run": round(1000 * cpu_s / max(runs, 1), 3),
        "seconds": round(time.monotonic() - started, 1),
        "load_average": [round(load, 2) for load in os.getloadavg()],
        "simulated": True,
    }


def table(args: argparse.Namespace) -> list[dict]:
    rows = []
    for scale in args.scales:
        for detector, repetitions in (("window", 2), ("window", 8), ("adaptive", args.repetitions)):
            one = argparse.Namespace(**vars(args))
            one.noise_scale, one.detector, one.repetitions = scale, detector, repetitions
            row = condition(one)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(
        "| noise scale (run σ) | detector | runs/night | 2% | 5% | 10% | median nights (5%) "
        "| false alarms /100 nights | CPU ms/run |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        rate = row["detection_rate"]
        label = (
            f"adaptive ({row['repetitions_per_night']}+, budget {row['budget']})"
            if row["detector"] == "adaptive"
            else f"window, {row['repetitions_per_night']} runs"
        )
        print(
            f"| {row['noise_scale']:g} ({row['noise_scale']:g}%) | {label} | "
            f"{row['runs_per_night']} | {rate['2']} | {rate['5']} | {rate['10']} | "
            f"{row['median_nights_to_confirm']['5']} | {row['false_alarms_per_100_nights']} | "
            f"{row['cpu_ms_per_run']} |"
        )
    print(f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load average {os.getloadavg()}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description="Measure nightly regression detection.")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--table", action="store_true", help="per scale: both detectors")
    parser.add_argument("--scales", type=float, nargs="+", default=[1.0, 3.0, 5.0])
    parser.add_argument("--detector", choices=("window", "adaptive"), default="adaptive")
    parser.add_argument("--nights", type=int, default=60)
    parser.add_argument("--trials", type=int, default=150, help="histories per condition")
    parser.add_argument("--repetitions", type=int, default=2, help="runs every night starts with")
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET, help="most runs a night")
    parser.add_argument("--noise-scale", type=float, default=1.0)
    parser.add_argument("--min-effect", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=20261201)
    args = parser.parse_args()
    if args.table:
        table(args)
        return
    report = condition(args)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>32}: {value}")


if __name__ == "__main__":
    main()
