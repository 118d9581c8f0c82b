"""Load a saved ``.mlpackage`` as an in-memory MIL program, and save one back.

The in-memory form is coremltools' own ``Program`` (pymil): the interpreter runs it, the fold pass
rewrites it, and ``ct.convert`` serialises it again with no optimisation passes, so what is saved
is exactly what was rewritten.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import coremltools as ct
from coremltools.converters.mil.frontend.milproto.load import load as load_milproto
from coremltools.converters.mil.mil import Program
from coremltools.proto import Model_pb2

from decodebench.analysis.graph import AnalysisError
from decodebench.formats.coreml.functions import default_function
from decodebench.formats.coreml.graph import load_program


class MilError(ValueError):
    """A program cannot be loaded, run, compared or rewritten; the message says why."""


@dataclass
class LoadedPackage:
    path: Path
    spec: Model_pb2.Model
    program: Program


@contextlib.contextmanager
def quiet_coremltools() -> Iterator[None]:
    """coremltools warns about untested torch versions and missing native libs on Linux."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"coremltools(\..*)?")
        yield


def load_package(path: Path | str) -> LoadedPackage:
    """Parse ``path`` (an mlprogram ``.mlpackage``) into a pymil program, weights included."""
    return load_packages(path, 1)[0]


def load_packages(path: Path | str, count: int) -> list[LoadedPackage]:
    """``count`` independent pymil programs of ``path``, its spec read and parsed once.

    Each is its own graph (a repair rewrites one in place without touching the others); pymil
    programs are too deeply linked for ``copy.deepcopy``, so each is built from the spec.
    """
    try:
        spec, model_directory = load_program(path)
    except AnalysisError as error:
        raise MilError(str(error)) from None
    loaded = []
    with quiet_coremltools():
        for _ in range(count):
            try:
                program = load_milproto(
                    spec, spec.specificationVersion, str(model_directory / "weights")
                )
            except (ValueError, NotImplementedError, KeyError) as error:
                raise MilError(f"{path}: coremltools cannot read this program ({error})") from None
            # pymil reads every program as defaulting to "main"; a multifunction package's
            # default is its spec's, and a saved copy keeps it.
            program.default_function_name = default_function(spec, program)
            # A package described function by function (a multifunction save) is saved so.
            program.export_as_multifunction = len(spec.description.functions) > 0
            loaded.append(LoadedPackage(path=Path(path), spec=spec, program=program))
    return loaded


def deployment_target(spec: Model_pb2.Model) -> ct.target:
    for target in ct.target:
        if target.value == spec.specificationVersion:
            return target
    raise MilError(f"unknown Core ML specification version {spec.specificationVersion}")


def save_package(
    program: Program,
    path: Path | str,
    like: Model_pb2.Model,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Serialise ``program`` to ``path`` with ``like``'s deployment target and descriptions.

    No graph pass runs but the backend's mandatory ones (the program is modified in place).
    The package is written next to ``path`` and moved into place, so a failure leaves no
    half-written package behind.
    """
    target = Path(path)
    with quiet_coremltools():
        model = ct.convert(
            program,
            convert_to="mlprogram",
            minimum_deployment_target=deployment_target(like),
            pass_pipeline=ct.PassPipeline.EMPTY,
            skip_model_load=True,
        )
    _copy_descriptions(like, model)
    model.user_defined_metadata.update(dict(metadata or {}))
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".saving-") as staging:
        staged = Path(staging) / target.name
        model.save(str(staged))
        if target.exists():
            shutil.rmtree(target)
        os.replace(staged, target)


def _copy_descriptions(source: Model_pb2.Model, model: ct.models.MLModel) -> None:
    description = source.description
    for key, value in description.metadata.userDefined.items():
        if key != "com.github.apple.coremltools.source":
            model.user_defined_metadata[key] = value
    for field, attribute in _DESCRIPTION_FIELDS.items():
        value = getattr(description.metadata, field)
        if value:
            setattr(model, attribute, value)
    for item in description.input:
        if item.shortDescription:
            model.input_description[item.name] = item.shortDescription
    for item in description.output:
        if item.shortDescription:
            model.output_description[item.name] = item.shortDescription


_DESCRIPTION_FIELDS = {
    "author": "author",
    "license": "license",
    "shortDescription": "short_description",
    "versionString": "version",
}
