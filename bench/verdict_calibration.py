"""How the verdicts behave under the default noise model, by number of A B B A repetitions.

For each design it simulates seeded sweeps through the simulated driver's timing model and the
real judge (decodebench.judging), and prints one JSON object: the share of A/A comparisons
judged "no significant change", the share of 5%-faster variants judged "faster", and how often
the 95% interval of a 3% speed-up covers 1.03.

    python -m bench.verdict_calibration --seeds 100
"""

from __future__ import annotations

import argparse
import json
import time

from decodebench.contracts.profiles import IPHONE_17_PRO
from decodebench.contracts.verdicts import Verdict
from decodebench.judging.simulation import SimulatedDesign, simulated_pair
from decodebench.judging.verdicts import judge_variant
from decodebench.timing import TimingParameters

BYTES_PER_TOKEN = 1_400_000_000


def rows(design: SimulatedDesign, speedup: float, seeds: range, resamples: int) -> list:
    judged = []
    for seed in seeds:
        baseline, variant = simulated_pair(
            IPHONE_17_PRO, TimingParameters(), design, BYTES_PER_TOKEN, speedup, seed=seed
        )
        judged.append(judge_variant(baseline, variant, n_resamples=resamples).decode_tok_s)
    return judged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--repetitions", default="1,2,4,8")
    args = parser.parse_args()
    started = time.monotonic()
    report: dict[str, object] = {"seeds": args.seeds, "noise_scale": 1.0, "by_repetitions": {}}
    for repetitions in (int(part) for part in args.repetitions.split(",")):
        design = SimulatedDesign(repetitions=repetitions)
        seeds = range(args.seeds)
        same = rows(design, 1.0, seeds, args.resamples)
        faster = rows(design, 1.05, range(10_000, 10_000 + args.seeds), args.resamples)
        covered = rows(design, 1.03, range(20_000, 20_000 + args.seeds), args.resamples)
        report["by_repetitions"][str(repetitions)] = {  # type: ignore[index]
            "a_a_no_significant_change": sum(
                r.verdict is Verdict.no_significant_change for r in same
            )
            / len(same),
            "five_percent_judged_faster": sum(r.label == "faster" for r in faster) / len(faster),
            "coverage_95": sum(r.ci_low <= 1.03 <= r.ci_high for r in covered) / len(covered),
        }
    report["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
