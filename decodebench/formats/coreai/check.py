"""A Core AI build's check against Apple's runtime: one decode step, held op by op.

The project's engine decodes the prompt first (so the step reads a cache the program wrote),
then Apple's runtime computes every value of the next step and the engine runs each op on the
runtime's operands (:func:`decodebench.formats.coreai.arbiter.hold_to_runtime`). An op beyond
its tolerance fails the build, naming the op. Whole runs are not compared token by token: on
Linux, Apple's runtime is an interpreter that sums fp16 products in fp16, one after another,
so over a whole step its logits drift from any faster order (about 0.2 on SmolLM2-135M) while
every op agrees.

Apple's runtime takes about 25 s for one SmolLM2-135M step with every value an output; a larger
asset is not held at build time (the report says so and why): the engine's kernels are held
op by op on smaller programs of the same ops (the tests, ``python -m bench.coreai_proof``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from decodebench.formats.coreai.program import BYTECODE

# An asset's bytecode holds its weights: SmolLM2-135M in fp16 is 270 MB.
HOLD_MAX_BYTES = 400 * 2**20
HOLD_PROMPT = (1, 2, 3, 4)


def hold_build(
    path: Path, prompt: Sequence[int] = HOLD_PROMPT, max_bytes: int = HOLD_MAX_BYTES
) -> str:
    """One line saying how the build's decode step agreed with Apple's runtime, or why it was
    not held. Raises :class:`decodebench.formats.coreai.arbiter.Disagreement` naming the op."""
    size = (Path(path) / BYTECODE).stat().st_size
    if size > max_bytes:
        return (
            f"not held to Apple's runtime at build time: {size / 2**20:,.0f} MiB of program is "
            f"over {max_bytes / 2**20:,.0f} MiB (one step in Apple's runtime would take minutes; "
            "the engine's kernels are held on smaller programs of the same ops)"
        )
    from decodebench.formats.coreai.arbiter import hold_to_runtime
    from decodebench.formats.coreai.session import open_session

    started = time.perf_counter()
    session = open_session(path)
    *head, last = prompt
    if head:
        session.prefill(head)
    feeds = session.feeds_at(last, len(head))
    function = session.program.functions["main"]
    held = hold_to_runtime(session.program, function, feeds)
    seconds = time.perf_counter() - started
    return (
        f"held op by op to Apple's runtime at position {len(head)}: {held.ops} ops agree, "
        f"{held.exact} bit-exact ({seconds:.1f} s)"
    )
