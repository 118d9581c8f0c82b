"""The interpreter's numerics, pinned: what each test program produced, bit for bit.

``python -m tests.support.interpreter_pins`` (from the repository root, with ``PYTHONPATH=.``) runs the
interpreter on

- every op case of ``tests/decodebench/formats/coreml/test_interpreter.py``, with fp32 inputs and again with fp16 inputs
  (an fp16 program rounds every intermediate);
- the project's tiny builds (fp16, 8-bit and 4-bit weights, both attention layouts), decoding a
  short prompt then greedy tokens: every position's logits;
- SmolLM2-135M fp16 (folded, states, context 256; only with ``--smollm2``, it takes minutes to
  build): the tokens, and a SHA-256 of every position's logits;

and writes them to ``tests/data/interpreter_pins.npz`` and ``interpreter_pins.json``.

OpenBLAS picks its kernels by the CPU it finds, and kernels of another family sum a product in
another order: on a CPU with AVX-512 its SkylakeX kernels make 7 of SmolLM2's 16 logit rows differ
from the Haswell kernels' in the last bit, with the same tokens. So SmolLM2 is decoded, to pin and
to check, in a process of its own with ``OPENBLAS_CORETYPE=Haswell`` (read when NumPy loads
OpenBLAS): the pin holds the interpreter's numerics, not the host's choice of kernels.
``tests/decodebench/formats/coreml/test_interpreter_equality.py`` runs the same programs and asks for the same bits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.paths import DATA, ROOT

ARRAYS = DATA / "interpreter_pins.npz"
SUMMARY = DATA / "interpreter_pins.json"
PROMPT = [3, 1, 4, 1, 5]
STEPS = 5
TINY_CONTEXT = 64
# (preset, attention, quant): what tests build, the three weight kinds and both layouts.
TINY_PACKAGES = (
    ("tiny-gqa", "repeat_kv", "fp16"),
    ("tiny-exaone", "folded", "fp16"),
    ("tiny-llama", "folded", "w8"),
    ("tiny-qwen", "folded", "w4"),
)
SMOLLM2_PROMPT = [1, 504, 3458, 314, 260, 1142, 282, 4649]
SMOLLM2_STEPS = 8


def op_cases() -> Iterator[tuple[str, Any, tuple[np.ndarray, ...]]]:
    """Every op case of the interpreter tests, fp32 then (float inputs) fp16."""
    from tests.decodebench.formats.coreml.test_interpreter import CASES

    for name in sorted(CASES):
        build, arrays, _ = CASES[name]
        yield f"{name}/fp32", build, arrays
        if all(array.dtype == np.float32 for array in arrays):
            yield f"{name}/fp16", build, tuple(array.astype(np.float16) for array in arrays)


def run_op_case(build: Any, arrays: tuple[np.ndarray, ...]) -> list[np.ndarray]:
    from tests.decodebench.formats.coreml.test_interpreter import run

    return run(build, *arrays)


def build_tiny(preset: str, attention: str, quant: str, directory: Path) -> Path:
    from decodebench.building.build import PACKAGE_NAME, build_variant
    from decodebench.contracts.domain import Attention, VariantSpec
    from decodebench.formats.coreml.program import quiet_coremltools

    variant = VariantSpec(attention=Attention(attention), context=TINY_CONTEXT, quant=quant)
    out = directory / f"{preset}-{attention}-{quant}"
    with quiet_coremltools():
        build_variant(preset, variant, out)
    return out / PACKAGE_NAME


def decode(package: Path, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """Greedy tokens after ``prompt`` and every position's logits, one program step each."""
    from decodebench.formats.coreml.verify import open_session

    session = open_session(package)
    token, tokens, rows = prompt[0], [], []
    for position in range(len(prompt) + steps - 1):
        logits = session.step(token, position)
        rows.append(logits)
        if position + 1 < len(prompt):
            token = prompt[position + 1]
        else:
            token = int(np.argmax(logits))
            tokens.append(token)
    return tokens, np.stack(rows)


def digest(rows: np.ndarray) -> list[str]:
    return [hashlib.sha256(np.ascontiguousarray(row).tobytes()).hexdigest() for row in rows]


def smollm2_package() -> Path:
    """The bench's SmolLM2 fp16 package (built once, cached)."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "bench.interpreter", "--build", "smollm2-fp16"]
    built = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return Path(built.stdout.strip().splitlines()[-1])


PIN_BLAS_CORE = "Haswell"


def decode_smollm2() -> dict[str, Any]:
    """SmolLM2's tokens and logit digests, decoded with OpenBLAS's ``PIN_BLAS_CORE`` kernels."""
    import os
    import subprocess
    import sys

    package = smollm2_package()
    command = [sys.executable, "-m", "tests.support.interpreter_pins", "--decode", str(package)]
    env = {**os.environ, "OPENBLAS_CORETYPE": PIN_BLAS_CORE, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def main() -> int:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smollm2", action="store_true", help="pin SmolLM2-135M too (slow)")
    parser.add_argument("--decode", metavar="PKG", help="print SmolLM2's pinned decode of PKG")
    args = parser.parse_args()
    if args.decode:
        tokens, logits = decode(Path(args.decode), SMOLLM2_PROMPT, SMOLLM2_STEPS)
        print(json.dumps({"tokens": tokens, "logits_sha256": digest(logits)}))
        return 0
    arrays: dict[str, np.ndarray] = {}
    summary: dict[str, Any] = {"ops": [], "packages": {}}
    for name, build, inputs in op_cases():
        try:
            outputs = run_op_case(build, inputs)
        except Exception:  # noqa: BLE001 - an fp16 variant pymil refuses to build is not pinned
            continue
        for index, output in enumerate(outputs):
            arrays[f"op/{name}/{index}"] = output
        summary["ops"].append(name)
    with tempfile.TemporaryDirectory() as directory:
        for preset, attention, quant in TINY_PACKAGES:
            key = f"{preset}/{attention}/{quant}"
            package = build_tiny(preset, attention, quant, Path(directory))
            tokens, logits = decode(package, PROMPT, STEPS)
            arrays[f"package/{key}"] = logits
            summary["packages"][key] = {"tokens": tokens}
    if args.smollm2:
        summary["smollm2"] = decode_smollm2()
    elif SUMMARY.is_file():  # keep the SmolLM2 pin made earlier
        kept = json.loads(SUMMARY.read_text()).get("smollm2")
        if kept:
            summary["smollm2"] = kept
    DATA.mkdir(exist_ok=True)
    np.savez_compressed(ARRAYS, **arrays)  # type: ignore[arg-type]
    SUMMARY.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"pinned {len(summary['ops'])} op cases, {len(summary['packages'])} tiny packages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
