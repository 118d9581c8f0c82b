"""Apple's Core AI runtime, as it runs on Linux: the interpreter compute kind, exact and slow
(a SmolLM2-135M-shaped fp16 step takes seconds). It is the arbiter of what a program means:
the project's engine is held to it op by op (:func:`probe`) and on whole calls (:func:`run`).

``AIModelAsset.executable()`` lowers the program and loads it; a call takes ``NDArray``
inputs by name and returns the outputs by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from decodebench.formats.coreai.program import CoreAIError, Function, Program

# What the runtime prints on the process's stderr for each function it loads.
_LOADING = re.compile(r"^ODIE \[\w+\]: Loading function '[^']*'$")


@contextlib.contextmanager
def _quiet_native() -> Iterator[None]:
    """The runtime prints a line per function it loads on the process's stdout and stderr:
    stdout is dropped, and stderr is passed on without those lines (a real complaint stays)."""
    try:
        saved = os.dup(1), os.dup(2)
    except OSError:
        yield
        return
    with open(os.devnull, "w") as sink, tempfile.TemporaryFile() as errors:
        sys.stderr.flush()
        os.dup2(sink.fileno(), 1)
        os.dup2(errors.fileno(), 2)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for descriptor in saved:
                os.close(descriptor)
            errors.seek(0)
            text = errors.read().decode(errors="replace")
            kept = [line for line in text.splitlines() if not _LOADING.match(line)]
            if kept:
                print("\n".join(kept), file=sys.stderr, flush=True)


async def _call(
    path: Path, function: str, calls: list[Mapping[str, np.ndarray]]
) -> list[dict[str, np.ndarray]]:
    from coreai.authoring.asset import AIModelAsset
    from coreai.runtime import NDArray

    asset = AIModelAsset.load(path)
    results = []
    async with asset.executable() as model:
        loaded = model.load_function(function)
        for feeds in calls:
            outputs = await loaded(
                {name: NDArray(np.ascontiguousarray(value)) for name, value in feeds.items()}
            )
            results.append(
                {name: np.asarray(value.numpy()) for name, value in outputs.items()}  # type: ignore[union-attr]
            )
    return results


def run(
    path: Path, function: str, calls: list[Mapping[str, np.ndarray]]
) -> list[dict[str, np.ndarray]]:
    """The outputs of ``function`` of the asset at ``path`` for each of ``calls`` (one load)."""
    try:
        with _quiet_native():
            return asyncio.run(_call(path, function, calls))
    except CoreAIError:
        raise
    except Exception as error:  # noqa: BLE001 - the runtime raises bare errors
        raise CoreAIError(f"{path}: Apple's runtime refused {function}: {error}") from error


def probe(
    program: Program, function: Function, feeds: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Every value ``function`` computes for ``feeds``, as Apple's runtime computes it: the
    program is rewritten so that each operation's result is an output, then run once.
    Keyed by the value keys of :mod:`decodebench.formats.coreai.program`."""
    from coreai._compiler import ir
    from coreai.authoring.asset import AIModelAsset, AIProgram
    from coreai.authoring.context import Context

    computed = [op for op in function.operations if op.kind != "constant"]
    keys = [op.results[0] for op in computed]
    types = [op.type_texts[0] for op in computed]
    module = AIModelAsset.load(program.path).program._module._mlir_module  # noqa: SLF001
    text = str(module.operation.get_asm(large_elements_limit=None))
    lines, inside = [], False
    for line in text.split("\n"):
        if f"coreai.graph @{function.name}(" in line:
            inside = True
            head = line[: line.index(") -> (") + len(") -> (")]
            named = (f'{kind} {{coreai.name = "v{index}"}}' for index, kind in enumerate(types))
            line = head + ", ".join(named) + ") {"
        elif inside and line.strip().startswith("coreai.output"):
            line = "    coreai.output " + ", ".join(keys) + " : " + ", ".join(types)
            inside = False
        lines.append(line)
    try:
        rewritten = ir.Module.parse("\n".join(lines), context=Context()._mlir_context)  # noqa: SLF001
    except Exception as error:  # noqa: BLE001
        raise CoreAIError(
            f"{program.path}: the probe of {function.name} does not parse: {error}"
        ) from error
    with tempfile.TemporaryDirectory() as scratch:
        probe_path = Path(scratch) / "probe.aimodel"
        AIProgram._from_mlir_module(rewritten).save_asset(probe_path)  # noqa: SLF001
        outputs = run(probe_path, function.name, [feeds])[0]
    return {key: outputs[f"v{index}"] for index, key in enumerate(keys)}
