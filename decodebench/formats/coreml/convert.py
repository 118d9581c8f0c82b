"""Convert decode-step models to Core ML, behind a small interface so a backend can be added.

Today's backend is coremltools (TorchScript trace -> MIL -> ``.mlpackage``): an ML program for
iOS 18 with fp16 compute. The converted interface is :mod:`decodebench.modeling`'s: inputs
``input_ids``, ``position``, ``causal_mask`` (decode only), the caches with ``kv="input"``;
outputs ``logits`` (then ``key_{i}``/``value_{i}`` with ``kv="input"``); states
``key_cache_{i}``/``value_cache_{i}`` [1, Hkv, context, head_dim] fp16 with ``kv="state"``.
With a prefill chunk the package is multifunction: ``main`` (decode, the default) and
``prefill``, sharing one copy of the weights.

The pipeline is coremltools' own, with what costs time and changes nothing removed (each measured
on the full EXAONE shape, see ``bench/build_exaone.py``).
``tests/decodebench/formats/coreml/test_convert.py`` compares the result with plain ``ct.convert`` +
``ct.optimize.coreml`` on the same recipe (:mod:`decodebench.formats.coreml.quant.plain`): fp16
programs are identical op for op; quantized ones have byte-equal compressed weights and decode
identically, the plain program holding one more negative-index guard on the token gather per
``ct.optimize.coreml`` call (see there):

- the trace is not re-run twice to check itself (``check_trace``), ~10 s;
- ``ct.convert`` runs its own frontend, main and backend pipelines, but validates the program
  once per pipeline instead of after each of ~100 passes (~8 s), and answers its TorchScript
  lowering's ``torch.equal(p, p)`` of every parameter with itself without reading 1.3B weights
  (~3 s); ``reduce_transposes`` is skipped (~9 s; it finds nothing to do in these decoders, which
  the equivalence test checks);
- the MIL consts are the torch parameters' own memory (no copy; see the ``o_proj`` cast in
  :mod:`decodebench.modeling`), and each fp16 weight is freed as soon as its compressed form
  replaces it;
- quantization rewrites the MIL program before it is serialized (``decodebench.formats.coreml.quant.apply``),
  instead of saving fp16, reloading, compressing and converting again;
- the weights are serialized straight into the package: no temporary package, no copies.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import coremltools as ct
import torch
from coremltools.converters.mil.converter import MILProtoBackend
from coremltools.converters.mil.mil import Program
from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipeline, PassPipelineManager
from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY
from coremltools.proto import Model_pb2

from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.presets import ModelConfig
from decodebench.formats.coreml import compat
from decodebench.formats.coreml.interface import input_types, output_types, state_types
from decodebench.formats.coreml.quant.apply import QuantPlan, apply_plan
from decodebench.formats.metadata import build_metadata
from decodebench.modeling import DecodeStepModel, example_inputs

DECODE_FUNCTION = "main"
PREFILL_FUNCTION = "prefill"
# Measured to change nothing in these decoders and slow (the convert tests keep that true).
SKIPPED_PASSES = frozenset({"common::reduce_transposes"})
_WEIGHTS_DIR = "weights"
_SPEC_AUTHOR = "com.apple.CoreML"

log = logging.getLogger(__name__)


class StageRecorder(Protocol):
    """Receives the named stages of a conversion (for timings and progress)."""

    def stage(self, name: str) -> contextlib.AbstractContextManager[None]: ...


class _NoStages:
    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        yield


# The models of a package's functions, by function name.
Models = dict[str, DecodeStepModel]


@dataclass(frozen=True)
class Conversion:
    """What every function of one conversion must match (``config``, ``variant``), and where
    its stages are recorded."""

    config: ModelConfig
    variant: VariantSpec
    stages: StageRecorder = field(default_factory=_NoStages)


class Converter(Protocol):
    name: str

    def versions(self) -> dict[str, str]:
        """Versions of everything that shapes the artifact (part of the build key)."""
        ...

    def convert(self, model: DecodeStepModel, conversion: Conversion) -> ct.models.MLModel: ...

    def save(self, converted: ct.models.MLModel, path: Path) -> None:
        """Write the artifact to ``path`` and release whatever the backend kept elsewhere."""
        ...

    def build_package(
        self, functions: Models, conversion: Conversion, path: Path, plan: QuantPlan | None = None
    ) -> dict[str, str]:
        """Convert (and quantize) straight into the package at ``path``; {const: constexpr op}.

        ``functions`` is consumed: each model is removed from it once converted, so that with
        the caller's references gone its fp16 weights are freed as quantization replaces them.
        """
        ...


class ConversionError(ValueError):
    """The model and the variant disagree, or the backend refused the graph."""


class CoreMLToolsConverter:
    name = "coremltools"

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__, "coremltools": ct.__version__}

    def to_program(self, model: DecodeStepModel, conversion: Conversion) -> Program:
        """Trace and convert one function to a MIL program, every main pass applied."""
        _check_matches(model, conversion.config, conversion.variant)
        stages = conversion.stages
        compat.install()
        with stages.stage("trace"):
            # Tracing runs one real call, which writes the cache; reset so the module is left
            # as it was handed to us.
            traced = compat.trace(model, example_inputs(model), check_trace=False)
            model.reset_cache()
        with stages.stage("convert"), _validating_once_per_pipeline(), _self_equal_for_free():
            program = ct.convert(
                traced,
                inputs=input_types(model),
                outputs=output_types(model),
                states=state_types(model),
                convert_to="milinternal",
                minimum_deployment_target=ct.target.iOS18,
                compute_precision=ct.precision.FLOAT16,
                pass_pipeline=main_pipeline(),
            )
            del traced
        return program

    def build_package(
        self, functions: Models, conversion: Conversion, path: Path, plan: QuantPlan | None = None
    ) -> dict[str, str]:
        stages = conversion.stages
        if set(functions) - {DECODE_FUNCTION, PREFILL_FUNCTION} or DECODE_FUNCTION not in functions:
            raise ConversionError(f"functions must be {DECODE_FUNCTION} [+ {PREFILL_FUNCTION}]")
        # One function is written straight to ``path``. Several are converted and saved alone,
        # then merged by coremltools, which deduplicates the (identically quantized) weights.
        single = len(functions) == 1
        rewritten: dict[str, str] = {}
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".functions-") as scratch:
            parts: dict[str, Path] = {}
            for name in list(functions):
                program = self.to_program(functions.pop(name), conversion)
                rewritten.update(_quantize(program, plan, stages))
                parts[name] = path if single else Path(scratch) / f"{name}.mlpackage"
                with stages.stage("save"):
                    write_package(program, parts[name], package_metadata(conversion))
                del program
            if not single:
                with stages.stage("save"):
                    descriptor = ct.utils.MultiFunctionDescriptor()
                    for name, part in parts.items():
                        descriptor.add_function(str(part), "main", name)
                    descriptor.default_function_name = DECODE_FUNCTION
                    ct.utils.save_multifunction(descriptor, str(path))
                    _restore_metadata(path, package_metadata(conversion))
        return rewritten

    def convert(self, model: DecodeStepModel, conversion: Conversion) -> ct.models.MLModel:
        """One function as an ``MLModel`` in a temporary package (moved by :meth:`save`)."""
        program = self.to_program(model, conversion)
        package = Path(tempfile.mkdtemp(suffix=".mlpackage"))
        package.rmdir()
        write_package(program, package, package_metadata(conversion))
        return ct.models.MLModel(str(package), skip_model_load=True, is_temp_package=True)

    def save(self, converted: ct.models.MLModel, path: Path) -> None:
        source = Path(converted.package_path) if converted.package_path else None
        if source is not None and converted.is_temp_package and source.is_dir():
            # Our own temporary package: move it (a rename on one filesystem), never copy GBs.
            shutil.move(str(source), str(path))
            return
        converted.save(str(path))
        # ct.convert writes the package to a temporary directory that coremltools deletes only
        # at interpreter exit: a long-lived build worker would keep gigabytes per build in /tmp.
        if converted.is_temp_package and converted.package_path:
            shutil.rmtree(converted.package_path, ignore_errors=True)


def main_pipeline() -> PassPipeline:
    pipeline = PassPipeline.DEFAULT
    pipeline.remove_passes(SKIPPED_PASSES)
    return pipeline


def run_passes(program: Program, pipeline: PassPipeline, validate: bool = True) -> None:
    """Apply ``pipeline``'s passes in order, validating the program once at the end.

    ``PassPipelineManager`` re-validates the whole program after every pass, which costs more
    than most passes themselves on a 1B-parameter decoder (~8 s of ``ct.convert`` on EXAONE);
    the passes do not depend on it.
    """
    for pass_name in pipeline.passes:
        graph_pass = PASS_REGISTRY[pass_name]
        graph_pass.set_options(pipeline.get_options(pass_name))
        graph_pass(program)
    if validate:
        # As PassPipelineManager: scopes are checked once dead code has been eliminated.
        program.validate(check_essential_scope="common::dead_code_elimination" in pipeline.passes)


@contextlib.contextmanager
def _validating_once_per_pipeline() -> Iterator[None]:
    """``ct.convert`` with its own frontend, main and backend pipelines, each pass as is, but the
    program validated once per pipeline instead of after every pass (see :func:`run_passes`)."""
    original = PassPipelineManager.__dict__["apply_pipeline"]

    def apply_pipeline(prog: Program, pass_pipeline: PassPipeline) -> None:
        pass_pipeline.validate()
        run_passes(prog, pass_pipeline)

    PassPipelineManager.apply_pipeline = staticmethod(apply_pipeline)  # type: ignore[method-assign]
    try:
        yield
    finally:
        PassPipelineManager.apply_pipeline = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _self_equal_for_free() -> Iterator[None]:
    """coremltools' TorchScript lowering asserts that every parameter equals its state_dict entry,
    which (``state_dict(keep_vars=True)``) is the very same tensor: on EXAONE, ~3 s comparing
    1.3B weights with themselves. ``torch.equal(t, t)`` is answered without reading ``t``; any
    other comparison is torch's. (A tensor holding NaN is unequal to itself in torch; coremltools
    would then stop with "tensor value not consistent", which was never the problem.)"""
    original = torch.equal

    def equal(left: torch.Tensor, right: torch.Tensor) -> bool:
        return True if left is right else original(left, right)

    torch.equal = equal  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.equal = original


def _quantize(program: Program, plan: QuantPlan | None, stages: StageRecorder) -> dict[str, str]:
    if plan is None or plan.recipe.is_fp16:
        return {}
    with stages.stage("quantize"):
        rewritten = apply_plan(program, plan)
        # What ct.optimize.coreml's conversion would run next; finds nothing but keeps parity
        # (without the passes the main pipeline skips, for the same reason).
        cleanup = PassPipeline.CLEANUP
        cleanup.remove_passes(SKIPPED_PASSES)
        run_passes(program, cleanup)
    return rewritten


def package_metadata(conversion: Conversion) -> dict[str, str]:
    return build_metadata(conversion.config, conversion.variant)


def _restore_metadata(path: Path, metadata: dict[str, str]) -> None:
    """``save_multifunction`` writes a new root spec without its parts' user metadata: put
    ours back into it."""
    if not metadata:
        return
    manifest = json.loads((path / "Manifest.json").read_text())
    root = path / "Data" / manifest["itemInfoEntries"][manifest["rootModelIdentifier"]]["path"]
    spec = Model_pb2.Model.FromString(root.read_bytes())
    spec.description.metadata.userDefined.update(metadata)
    root.write_bytes(spec.SerializeToString())


def write_package(program: Program, path: Path, metadata: dict[str, str] | None = None) -> None:
    """Serialize ``program`` into a new ``.mlpackage`` at ``path``, weights written in place,
    with ``metadata`` as the model's user-defined metadata."""
    from coremltools.libmodelpackage import ModelPackage

    if path.exists():
        raise FileExistsError(f"{path} exists")
    staging = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    weights = staging / _WEIGHTS_DIR
    weights.mkdir(parents=True)
    try:
        run_passes(program, PassPipeline.get_pipeline("backend_mlprogram"), validate=False)
        spec = MILProtoBackend()(
            program,
            weights_dir=str(weights),
            specification_version=ct.target.iOS18.value,
            convert_from="milinternal",
            convert_to="mlprogram",
        )
        spec.description.metadata.userDefined.update(metadata or {})
        spec_file = staging / "model.mlmodel"
        spec_file.write_bytes(spec.SerializeToString())
        empty = staging / "empty-weights"
        empty.mkdir()
        package = ModelPackage(str(path))
        package.setRootModel(
            str(spec_file), "model.mlmodel", _SPEC_AUTHOR, "CoreML Model Specification"
        )
        # Registered empty (an instant copy), then filled by a rename: no multi-GB copy.
        item = package.addItem(str(empty), _WEIGHTS_DIR, _SPEC_AUTHOR, "CoreML Model Weights")
        target = Path(path) / "Data" / _SPEC_AUTHOR / _WEIGHTS_DIR
        del item, package
        for blob in weights.iterdir():
            blob.rename(target / blob.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_matches(model: DecodeStepModel, config: ModelConfig, variant: VariantSpec) -> None:
    if model.config != config:
        raise ConversionError(f"model was built for {model.config.name}, not {config.name}")
    if variant.layers is not None and variant.layers != config.num_layers:
        raise ConversionError(
            f"config has {config.num_layers} layers but the variant asks for {variant.layers}"
        )
    if model.context != variant.context:
        raise ConversionError(
            f"model has a {model.context}-token cache but the variant asks for {variant.context}"
        )
    if model.attention != variant.attention:
        raise ConversionError(
            f"model uses {model.attention.value} attention but the variant asks for "
            f"{variant.attention.value}"
        )
    if model.kv_window != variant.kv_window:
        raise ConversionError(
            f"model has kv_window={model.kv_window} but the variant asks for {variant.kv_window}"
        )
    if model.kv != variant.kv:
        raise ConversionError(
            f"model keeps its KV cache as {model.kv.value} but the variant asks for "
            f"{variant.kv.value}"
        )


DEFAULT_CONVERTER: Converter = CoreMLToolsConverter()


def convert(
    model: DecodeStepModel,
    config: ModelConfig,
    variant: VariantSpec,
    stages: StageRecorder | None = None,
    converter: Converter = DEFAULT_CONVERTER,
) -> ct.models.MLModel:
    return converter.convert(model, Conversion(config, variant, stages or _NoStages()))
