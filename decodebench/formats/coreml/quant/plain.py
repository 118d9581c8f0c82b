"""A recipe applied the plain way: ``ct.optimize.coreml`` on a ``ct.convert``-ed model.

This is the baseline our pipeline (:mod:`decodebench.formats.coreml.quant.apply`, rewriting the MIL
program before it is serialized) is compared against, in
``tests/decodebench/formats/coreml/test_convert.py`` and ``bench/build_exaone.py``: the same scheme for
every weight, spelled as coremltools configs.

- int8/int4 become ``OpLinearQuantizerConfig(mode="linear_symmetric")`` per channel or per block:
  coremltools computes them itself (our numerics are bit-identical to it).
- ``lutN`` becomes ``OpPalettizerConfig(mode="custom", lut_function=...)`` with our k-means
  (:func:`decodebench.formats.coreml.quant.numeric.palettize`): coremltools' own ``mode="kmeans"`` needs
  ``kmeans1d`` or scikit-learn, neither a dependency here, and computes another table (kmeans1d's
  exact 1-D optimum, or scikit-learn's k-means++), so with it the two packages would differ in
  every palettized weight. The palettizer, the op it emits and the save are coremltools'.
- ``weight_threshold=0``: our recipe compresses every weight it names, whatever its size
  (coremltools' default leaves tensors of at most 2,048 elements in fp16).

What stays different, by coremltools' design: every ``ct.optimize.coreml`` call reloads the
program from its protobuf and runs the default pass pipeline again, and one of its passes,
``common::guard_negative_gather_indices``, is not idempotent: each run wraps the index of every
signed-index ``gather`` (the token embedding) in one more ``greater_equal``/``add``/``select``
guard (and its scalar consts; the backend's int16 round-trip casts are not added every time),
so the plain program has ``optimize_calls`` more guards per signed-index ``gather``. They change
no result for a token id in the vocabulary.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict

from decodebench.contracts.recipes import Scheme
from decodebench.formats.coreml.quant.apply import QuantPlan
from decodebench.formats.coreml.quant.numeric import palettize


def _lut_function(bits: int) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    def lut_function(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        table = palettize(torch.from_numpy(np.ascontiguousarray(weight, np.float16)), bits)
        return table.lut, table.indices

    return lut_function


def parameter_for_const(const_name: str, parameters: Iterable[str]) -> str | None:
    """The torch parameter a const of a ``ct.convert``-ed program holds: its name is the
    parameter's with ``.`` sanitized to ``_`` (plus suffixes such as ``_to_fp16``)."""
    best = None
    for parameter in parameters:
        sanitized = parameter.replace(".", "_")
        if const_name in (parameter, sanitized) or const_name.startswith(
            (sanitized + "_", parameter + "_")
        ):
            if best is None or len(parameter) > len(best):
                best = parameter
    return best


def plain_configs(
    const_names: Iterable[str], parameters: Iterable[str], plan: QuantPlan
) -> dict[str, dict[str, object]]:
    """``{"palettize": {const: config}, "linear": {const: config}}`` for ``plan``'s recipe."""
    from coremltools.optimize import coreml as cto

    parameters = list(parameters)
    configs: dict[str, dict[str, object]] = {"palettize": {}, "linear": {}}
    for const in const_names:
        parameter = parameter_for_const(const, parameters)
        scheme: Scheme | None = plan.scheme_for(parameter) if parameter else None
        if scheme is None or not scheme.compressed:
            continue
        if scheme.kind == "lut":
            configs["palettize"][const] = cto.OpPalettizerConfig(
                mode="custom",
                lut_function=_lut_function(scheme.bits),
                weight_threshold=0,
            )
        else:
            configs["linear"][const] = cto.OpLinearQuantizerConfig(
                mode="linear_symmetric",
                dtype=f"int{scheme.bits}",
                granularity="per_block" if scheme.block else "per_channel",
                block_size=scheme.block or None,
                weight_threshold=0,
            )
    return configs


def optimize_plain(
    mlmodel: object,
    parameters: Iterable[str],
    plan: QuantPlan,
    lap: Callable[[str], None] | None = None,
) -> object:
    """``ct.optimize.coreml`` palettization then linear quantization of ``mlmodel`` (an
    ``MLModel`` from ``ct.convert``), as ``plan`` says; each call is skipped when it has nothing
    to do. ``lap(stage)`` is called after each stage that ran."""
    from coremltools.optimize import coreml as cto

    names = [
        op.name
        for function in mlmodel._mil_program.functions.values()  # type: ignore[attr-defined]
        for op in function.operations
        if op.op_type == "const"
    ]
    configs = plain_configs(names, parameters, plan)
    if configs["palettize"]:
        mlmodel = cto.palettize_weights(
            mlmodel, cto.OptimizationConfig(op_name_configs=configs["palettize"])
        )
        if lap:
            lap("palettize")
    if configs["linear"]:
        mlmodel = cto.linear_quantize_weights(
            mlmodel, cto.OptimizationConfig(op_name_configs=configs["linear"])
        )
        if lap:
            lap("linear_quantize")
    return mlmodel


def optimize_calls(plan: QuantPlan, parameters: Iterable[str]) -> int:
    """How many ``ct.optimize.coreml`` calls :func:`optimize_plain` makes for ``plan``."""
    schemes = [plan.scheme_for(name) for name in parameters]
    kinds = {scheme.kind for scheme in schemes if scheme is not None and scheme.compressed}
    return int("lut" in kinds) + int(bool(kinds - {"lut"}))


class WeightComparison(BaseModel):
    """Per compressed weight (``constexpr_*`` op, by name) of two packages: are their stored
    arrays (indices or integers, tables or scales) byte for byte the same?"""

    model_config = ConfigDict(frozen=True)

    equal: list[str]
    different: list[str]
    only_a: list[str]
    only_b: list[str]

    @property
    def identical(self) -> bool:
        return bool(self.equal) and not (self.different or self.only_a or self.only_b)


def _stored_weights(path: Path) -> dict[str, dict[str, str]]:
    """Per ``constexpr_*`` op: a SHA-256 of each stored array's dtype, shape and bytes (a digest
    rather than a copy: the arrays of a full-size model are gigabytes)."""
    from decodebench.formats.coreml.program import load_package

    weights = {}
    for function in load_package(path).program.functions.values():
        for op in function.operations:
            if op.op_type.startswith("constexpr_"):
                digests = {}
                for key, var in op.inputs.items():
                    value = var.val
                    if isinstance(value, np.ndarray):
                        digest = hashlib.sha256(f"{value.dtype}{value.shape}".encode())
                        digest.update(np.ascontiguousarray(value).reshape(-1).view(np.uint8).data)
                        digests[key] = digest.hexdigest()
                weights[op.name] = digests
    return weights


def compare_weights(a: Path, b: Path) -> WeightComparison:
    stored_a, stored_b = _stored_weights(a), _stored_weights(b)
    common = sorted(set(stored_a) & set(stored_b))
    return WeightComparison(
        equal=[name for name in common if stored_a[name] == stored_b[name]],
        different=[name for name in common if stored_a[name] != stored_b[name]],
        only_a=sorted(set(stored_a) - set(stored_b)),
        only_b=sorted(set(stored_b) - set(stored_a)),
    )
