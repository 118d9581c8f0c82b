"""Normalisation patterns as converters emit them, found from the dataflow.

Three shapes are recognised (casts between the ops are looked through):

- **RMSNorm, traced**: ``v = x``; ``square(v)`` (``pow(v, 2)``, ``mul(v, v)`` or ``square``) ->
  ``reduce_mean`` over the last axis -> ``add`` eps -> ``rsqrt`` -> ``mul(v, r)``, or ``sqrt`` ->
  ``real_div(v, s)``; then usually ``mul`` by the weight. In fp16 conversions the fp32 upcast
  transformers writes is dropped, so ``v ** 2`` overflows once ``|v|`` passes 255.9.
- **LayerNorm, traced**: the same on the centred value ``v = x - reduce_mean(x)``.
- **coremltools' ``rms_norm`` lowering**: ``m = reduce_max(abs(x))``, ``square(x / m)`` ->
  ``reduce_mean`` -> ``add`` eps -> ``sqrt`` -> ``mul(·, m)`` -> ``real_div(x, ·)``. It cannot
  overflow, but it adds eps to the mean of the *scaled* squares, which is eps·m² on the true
  scale, and it divides by zero on an all-zero row.

:class:`Norm` records the pattern's ops by part, so the diagnosis can name each op
("square", "mean of squares" ...) and :mod:`decodebench.formats.coreml.norm_repair` can rewrite it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

SQUARES = frozenset({"pow", "mul", "square"})
MAX_CAST_HOPS = 2


@dataclass
class Norm:
    kind: Literal["rms", "layer", "coreml_rms"]
    operand: Any  # v: the value squared (x, or x - mean(x))
    source: Any  # x: the norm's input
    square: Any
    mean: Any
    eps_add: Any
    root: Any  # rsqrt or sqrt
    normalise: Any  # mul(v, rsqrt) or real_div(v, sqrt ...)
    eps: float
    weight: Any | None = None  # the mul by the learned scale, when there is one
    centre: Any | None = None  # LayerNorm: the sub making v
    prescale: list[Any] = field(default_factory=list)  # coremltools' lowering: abs, max, div
    rescale: Any | None = None  # coremltools' lowering: mul(sqrt, m)

    @property
    def output(self) -> Any:
        return (self.weight or self.normalise).outputs[0]

    def parts(self) -> dict[int, str]:
        """id(op) -> the part it plays, for naming ops."""
        named: dict[int, str] = {}
        for op in self.prescale:
            named[id(op)] = {"abs": "|x|", "reduce_max": "max|x|"}.get(op.op_type, "pre-scale")
        if self.centre is not None:
            named[id(self.centre)] = "centre"
        named[id(self.square)] = "square"
        named[id(self.mean)] = "mean of squares"
        named[id(self.eps_add)] = "variance + eps"
        named[id(self.root)] = self.root.op_type
        if self.rescale is not None:
            named[id(self.rescale)] = "rescale"
        named[id(self.normalise)] = "normalise"
        if self.weight is not None:
            named[id(self.weight)] = "weight"
        return named

    def ops(self) -> list[Any]:
        found = [*self.prescale, self.square, self.mean, self.eps_add, self.root, self.normalise]
        found += [op for op in (self.centre, self.rescale, self.weight) if op is not None]
        return found


def _through_casts(var: Any) -> Any:
    """The value ``var`` is a cast of (up to two casts back), or ``var`` itself."""
    for _ in range(MAX_CAST_HOPS):
        if var.op is None or var.op.op_type != "cast":
            break
        var = var.op.inputs["x"]
    return var


def _readers(var: Any) -> list[Any]:
    """Ops reading ``var`` or a cast of it."""
    found = []
    for op in var.child_ops:
        if op.op_type == "cast":
            found += _readers(op.outputs[0])
        else:
            found.append(op)
    return found


def _const(var: Any) -> float | None:
    value = (
        var.val if var is not None and var.op is not None and var.op.op_type == "const" else None
    )
    if value is None:
        return None
    try:
        return float(value) if getattr(value, "size", 1) == 1 else None
    except (TypeError, ValueError):
        return None


def _other(op: Any, var: Any) -> Any:
    x, y = op.inputs.get("x"), op.inputs.get("y")
    return y if _through_casts(x) is _through_casts(var) or x is var else x


def _squared(op: Any) -> Any | None:
    """The value ``op`` squares, or None."""
    if op.op_type == "square":
        return op.inputs["x"]
    if op.op_type == "pow" and _const(op.inputs["y"]) == 2.0:
        return op.inputs["x"]
    if op.op_type == "mul" and op.inputs["x"] is op.inputs["y"]:
        return op.inputs["x"]
    return None


def _last_axis_mean(op: Any) -> bool:
    if op.op_type != "reduce_mean":
        return False
    axes = op.inputs.get("axes")
    rank = len(op.inputs["x"].shape)
    if axes is None or axes.val is None:
        return False
    keep = op.inputs.get("keep_dims")
    return [int(a) % rank for a in axes.val] == [rank - 1] and bool(keep is not None and keep.val)


def _single(ops: list[Any], *types: str) -> Any | None:
    matching = [op for op in ops if op.op_type in types]
    return matching[0] if len(matching) == 1 else None


def _match(square: Any) -> Norm | None:
    squared = _squared(square)
    if squared is None:
        return None
    mean = _single(_readers(square.outputs[0]), "reduce_mean")
    if mean is None or not _last_axis_mean(mean):
        return None
    eps_add = _single(_readers(mean.outputs[0]), "add")
    if eps_add is None:
        return None
    eps = _const(_other(eps_add, mean.outputs[0]))
    if eps is None:
        return None
    root = _single(_readers(eps_add.outputs[0]), "rsqrt", "sqrt")
    if root is None:
        return None
    operand = _through_casts(squared)
    prescale: list[Any] = []
    rescale = None
    source = operand
    kind: Literal["rms", "layer", "coreml_rms"] = "rms"
    if operand.op is not None and operand.op.op_type == "real_div":
        divisor = operand.op.inputs["y"]
        maximum = divisor.op
        if maximum is not None and maximum.op_type == "reduce_max":
            absolute = maximum.inputs["x"].op
            if absolute is not None and absolute.op_type == "abs":
                source = operand.op.inputs["x"]
                if _through_casts(absolute.inputs["x"]) is _through_casts(source):
                    kind = "coreml_rms"
                    prescale = [absolute, maximum, operand.op]
    normalise = None
    if kind == "coreml_rms":
        rescale = _single(_readers(root.outputs[0]), "mul")
        if rescale is None or _through_casts(_other(rescale, root.outputs[0])) is not divisor:
            return None
        normalise = _single(_readers(rescale.outputs[0]), "real_div")
        if normalise is None or _through_casts(normalise.inputs["x"]) is not _through_casts(source):
            return None
    elif root.op_type == "rsqrt":
        normalise = _single(_readers(root.outputs[0]), "mul")
        if normalise is None or _through_casts(_other(normalise, root.outputs[0])) is not operand:
            return None
    else:
        normalise = _single(_readers(root.outputs[0]), "real_div")
        if normalise is None or _through_casts(normalise.inputs["x"]) is not operand:
            return None
    centre = None
    if kind != "coreml_rms" and operand.op is not None and operand.op.op_type == "sub":
        x, subtracted = operand.op.inputs["x"], operand.op.inputs["y"]
        if subtracted.op is not None and _last_axis_mean(subtracted.op):
            if _through_casts(subtracted.op.inputs["x"]) is _through_casts(x):
                kind, centre, source = "layer", operand.op, x
    weight = _single(_readers(normalise.outputs[0]), "mul")
    if weight is not None and _const(_other(weight, normalise.outputs[0])) is None:
        scale = _other(weight, normalise.outputs[0])
        if scale.op is None or scale.op.op_type not in ("const", "constexpr_lut_to_dense"):
            weight = None
    return Norm(
        kind=kind,
        operand=operand,
        source=_through_casts(source),
        square=square,
        mean=mean,
        eps_add=eps_add,
        root=root,
        normalise=normalise,
        eps=eps,
        weight=weight,
        centre=centre,
        prescale=prescale,
        rescale=rescale,
    )


def find_norms(function: Any) -> list[Norm]:
    """Every normalisation pattern of ``function``, in program order."""
    found = []
    for op in function.operations:
        if op.op_type in SQUARES:
            norm = _match(op)
            if norm is not None:
                found.append(norm)
    return found
