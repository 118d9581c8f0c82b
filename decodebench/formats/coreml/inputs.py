"""Recognise the decode-step interface of a program: which input is the token, the position, the
causal mask, which output holds the logits, and how long the context is.

Programs the project builds use ``input_ids`` [1, 1], ``position`` [1], ``causal_mask``
[1, 1, 1, ctx] and ``logits``; converted third-party programs use other names, shapes and orders.
Each input's role is read from the dataflow first (:mod:`decodebench.formats.coreml.roles`: the token
indexes the vocabulary-sized embedding, the position the cache write, RoPE table or mask
construction, the mask meets the attention scores). An input the dataflow says nothing about
is recognised by name (``ids``/``token``, ``pos``/``position``, ``mask``), then by dtype and
shape (one integer element, a last axis as long as the KV cache). Only when the graph itself is
ambiguous (two inputs feed the embedding, say) or nothing decides, the user passes a mapping
file::

    {"token": "tok", "position": "pos", "mask": "attn_bias", "mask_kind": "additive",
     "logits": "out", "b": {"token": "input_ids"}}

Top-level keys apply to both programs, ``"a"``/``"b"`` override them for one program.
``mask_kind`` is ``additive`` (0 visible, -inf hidden) or ``binary`` (1 visible, 0 hidden).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from decodebench.formats.coreml.interpreter import Interpreter, TensorSpec
from decodebench.formats.coreml.program import MilError
from decodebench.formats.coreml.roles import Evidence, infer_roles

TOKEN_NAME = re.compile(r"(^|_)(input_?ids|ids|tokens?|token_ids?)($|_)", re.IGNORECASE)
POSITION_NAME = re.compile(r"(pos|position|positions|cache_position|step|offset)", re.IGNORECASE)
MASK_NAME = re.compile(r"mask", re.IGNORECASE)
LOGITS_NAME = re.compile(r"logit", re.IGNORECASE)


class InputMapping(BaseModel):
    """What the user tells us about one program (every field optional)."""

    model_config = ConfigDict(extra="forbid")

    token: str | None = None
    position: str | None = None
    mask: str | None = None
    mask_kind: Literal["additive", "binary"] | None = None
    logits: str | None = None


class MappingFile(InputMapping):
    a: InputMapping | None = None
    b: InputMapping | None = None

    def for_program(self, which: Literal["a", "b"]) -> InputMapping:
        shared = self.model_dump(exclude={"a", "b"}, exclude_none=True)
        override = getattr(self, which)
        if override is not None:
            shared.update(override.model_dump(exclude_none=True))
        return InputMapping(**shared)


def load_mapping(path: Path | str) -> MappingFile:
    try:
        return MappingFile.model_validate(json.loads(Path(path).read_text()))
    except OSError as error:
        raise MilError(f"cannot read the input mapping {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise MilError(f"the input mapping {path} is not JSON: {error}") from None
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise MilError(f"the input mapping {path}: {where}: {first['msg']}") from None


class DecodeInterface(BaseModel):
    """How to drive one decode step of a program."""

    model_config = ConfigDict(frozen=True)

    token: str
    position: str | None
    mask: str | None
    mask_kind: Literal["additive", "binary"]
    logits: str
    context: int
    vocab: int
    states: list[str]
    # KV cache inputs -> the outputs returning them (a program without states); empty otherwise.
    caches: dict[str, str] = {}


def _is_int(spec: TensorSpec) -> bool:
    return spec.dtype.kind in "iu"


def _size(spec: TensorSpec) -> int:
    return math.prod(spec.shape)


def _pick(
    role: str, candidates: list[TensorSpec], pattern: re.Pattern[str], program: str
) -> TensorSpec | None:
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    named = [spec for spec in candidates if pattern.search(spec.name)]
    if len(named) == 1:
        return named[0]
    names = ", ".join(spec.name for spec in candidates)
    raise MilError(
        f"{program}: cannot tell which input is the {role} (candidates: {names}); "
        "name it in an --inputs mapping file"
    )


def _by_dataflow(
    role: str, evidence: dict[str, Evidence], taken: set[str], program: str
) -> str | None:
    """The one input whose dataflow shows ``role``; an error if several do."""
    shown = [name for name, found in evidence.items() if name not in taken and getattr(found, role)]
    if len(shown) > 1:
        why = "; ".join(f"{name} {getattr(evidence[name], role)[0]}" for name in shown)
        raise MilError(
            f"{program}: the graph is ambiguous, {len(shown)} inputs act as the {role} ({why}); "
            "name it in an --inputs mapping file"
        )
    return shown[0] if shown else None


def _named(interpreter: Interpreter, name: str, role: str, program: str) -> TensorSpec:
    if name not in interpreter.inputs:
        known = ", ".join(interpreter.inputs) or "none"
        raise MilError(f"{program}: the mapping names {role} input {name!r}; inputs are {known}")
    return interpreter.inputs[name]


def recognise(
    interpreter: Interpreter,
    mapping: InputMapping | None = None,
    program: str = "program",
    caches: Mapping[str, str] | None = None,
) -> DecodeInterface:
    """The decode interface of ``interpreter``'s function, or an error naming what is unclear.

    The KV cache is the program's states, or, without states, ``caches``: the cache inputs and
    the outputs that return them (:mod:`decodebench.formats.coreml.cache_io` pairs them); those take no
    other role.
    """
    mapping = mapping or InputMapping()
    caches = dict(caches or {})
    if not interpreter.states and not caches:
        raise MilError(
            f"{program}: has no states and no cache inputs; only decode steps whose KV cache is "
            "Core ML states or inputs returned whole as outputs can be driven"
        )
    context = (
        _context_from_states(interpreter)
        if interpreter.states
        else _context_of(interpreter, caches)
    )
    specs = [spec for spec in interpreter.inputs.values() if spec.name not in caches]
    # Every cache a ring of a sliding window (all layers slide): the mask still spans the context.
    context = max(
        [context] + [spec.shape[-1] for spec in specs if spec.shape and MASK_NAME.search(spec.name)]
    )
    logits = _logits(interpreter, mapping, program, set(caches.values()))
    evidence = infer_roles(interpreter.function, logits.shape[-1], context)
    mapped = {name for name in (mapping.token, mapping.position, mapping.mask) if name}
    mapped |= set(caches)

    token = _token(interpreter, mapping, program, evidence, mapped, specs)
    rest = [spec for spec in specs if spec.name != token.name]
    taken = mapped | {token.name}
    position = _position(interpreter, mapping, program, evidence, taken, rest)
    rest = [spec for spec in rest if position is None or spec.name != position.name]
    taken |= {position.name} if position else set()
    mask = _mask(interpreter, mapping, program, evidence, taken, rest, context)
    rest = [spec for spec in rest if mask is None or spec.name != mask.name]
    _check_the_rest(program, rest, mask, context)
    mask_kind = mapping.mask_kind or (
        "binary" if mask is not None and mask.dtype.kind in "biu" else "additive"
    )
    return DecodeInterface(
        token=token.name,
        position=None if position is None else position.name,
        mask=None if mask is None else mask.name,
        mask_kind=mask_kind,
        logits=logits.name,
        context=context,
        vocab=logits.shape[-1],
        states=sorted(interpreter.states),
        caches=caches,
    )


def _token(
    interpreter: Interpreter,
    mapping: InputMapping,
    program: str,
    evidence: dict[str, Evidence],
    mapped: set[str],
    specs: list[TensorSpec],
) -> TensorSpec:
    """The token input: as mapped, else as the dataflow shows, else by its name."""
    if mapping.token:
        return _named(interpreter, mapping.token, "token", program)
    if flowing := _by_dataflow("token", evidence, mapped, program):
        return interpreter.inputs[flowing]
    ints = [spec for spec in specs if _is_int(spec) and _size(spec) == 1]
    picked = _pick("token", ints, TOKEN_NAME, program)
    if picked is None:
        raise MilError(f"{program}: no input looks like a token id (one integer element)")
    return picked


def _position(
    interpreter: Interpreter,
    mapping: InputMapping,
    program: str,
    evidence: dict[str, Evidence],
    taken: set[str],
    rest: list[TensorSpec],
) -> TensorSpec | None:
    """The position input, if any: as mapped, else as the dataflow shows, else by its name."""
    if mapping.position:
        return _named(interpreter, mapping.position, "position", program)
    if flowing := _by_dataflow("position", evidence, taken, program):
        return interpreter.inputs[flowing]
    ints = [spec for spec in rest if _is_int(spec) and _size(spec) == 1]
    return _pick("position", ints, POSITION_NAME, program)


def _mask(
    interpreter: Interpreter,
    mapping: InputMapping,
    program: str,
    evidence: dict[str, Evidence],
    taken: set[str],
    rest: list[TensorSpec],
    context: int,
) -> TensorSpec | None:
    """The causal mask input, if any: as mapped, else as the dataflow shows, else by its
    name among the inputs as long as the context."""
    if mapping.mask:
        return _named(interpreter, mapping.mask, "mask", program)
    if flowing := _by_dataflow("mask", evidence, taken, program):
        return interpreter.inputs[flowing]
    masks = [spec for spec in rest if spec.shape and spec.shape[-1] == context]
    return _pick("causal mask", masks, MASK_NAME, program)


def _check_the_rest(
    program: str, rest: list[TensorSpec], mask: TensorSpec | None, context: int
) -> None:
    """No input left without a role, and the mask as long as the KV cache."""
    if rest:
        unknown = ", ".join(f"{spec.name} {list(spec.shape)} {spec.dtype}" for spec in rest)
        raise MilError(
            f"{program}: cannot tell what input(s) {unknown} are; "
            "map them in an --inputs file (token, position, mask)"
        )
    if mask is not None and mask.shape[-1] != context:
        raise MilError(
            f"{program}: mask {mask.name!r} has {mask.shape[-1]} keys but the KV cache holds "
            f"{context} positions"
        )


def _context_from_states(interpreter: Interpreter) -> int:
    # A KV cache is [..., context, head_dim]: the second-to-last axis. The context is the
    # longest cache; a sliding layer's ring (kv_window) holds only its window, and a ring only
    # makes sense next to full-context caches, so two lengths at most.
    lengths = {spec.shape[-2] for spec in interpreter.states.values() if len(spec.shape) >= 2}
    if not lengths or len(lengths) > 2:
        raise MilError(f"states disagree on the context length: {sorted(lengths)}")
    return max(lengths)


def _context_of(interpreter: Interpreter, caches: Mapping[str, str]) -> int:
    # Cache inputs are [..., context, head_dim] like states, and hold the whole context each.
    lengths = {interpreter.inputs[name].shape[-2] for name in caches}
    if len(lengths) != 1:
        raise MilError(f"cache inputs disagree on the context length: {sorted(lengths)}")
    return lengths.pop()


def _logits(
    interpreter: Interpreter, mapping: InputMapping, program: str, caches: set[str]
) -> TensorSpec:
    outputs = {spec.name: spec for spec in interpreter.outputs if spec.name not in caches}
    if mapping.logits:
        if mapping.logits not in outputs:
            raise MilError(
                f"{program}: no output {mapping.logits!r}; outputs are {', '.join(outputs)}"
            )
        return outputs[mapping.logits]
    floats = [spec for spec in outputs.values() if spec.dtype.kind == "f" and spec.shape]
    named = [spec for spec in floats if LOGITS_NAME.search(spec.name)]
    if len(named) == 1:
        return named[0]
    if not floats:
        raise MilError(f"{program}: no floating-point output to read logits from")
    return max(floats, key=lambda spec: spec.shape[-1])


def step_feed(
    interpreter: Interpreter, interface: DecodeInterface, token: int, position: int
) -> dict[str, Any]:
    """The inputs of one decode step: ``token`` written at ``position``."""
    if not 0 <= position < interface.context:
        raise MilError(f"position {position} outside the context of {interface.context}")
    if not 0 <= token < interface.vocab:
        raise MilError(f"token {token} outside the vocabulary of {interface.vocab}")
    specs = interpreter.inputs
    feed: dict[str, Any] = {
        interface.token: np.full(specs[interface.token].shape, token, specs[interface.token].dtype)
    }
    if interface.position is not None:
        spec = specs[interface.position]
        feed[interface.position] = np.full(spec.shape, position, spec.dtype)
    if interface.mask is not None:
        spec = specs[interface.mask]
        visible = np.arange(interface.context) <= position
        if interface.mask_kind == "additive":
            row = np.where(visible, 0.0, -np.inf)
        else:
            row = visible.astype(np.float64)
        feed[interface.mask] = np.broadcast_to(row, spec.shape).astype(spec.dtype)
    return feed
