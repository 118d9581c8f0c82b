"""A server's build, made by a worker: :func:`build_assignment` chooses the source once from the
build's spec (:mod:`decodebench.building.sources`), builds through
:func:`decodebench.building.build.build`, adds the references of a model with a tokenizer and
checks that both sides key the build alike.

What a user brought (the files of an uploaded checkpoint or package) is fetched from the server
into the worker's model cache, ``<work_dir>/models/<content sha256>/``
(:func:`decodebench.building.sources.fetch_files`).

References: the assignment names the prompts (the built-in chat set or the sweep's own texts) and
the decode length; the worker tokenizes them with the model's chat template, lets transformers
decode them greedily in fp32 (cached by model, prompts and decode length under the worker's
folder, so a sweep's variants compute them once), uploads the model's detokenizer table to the
artifact store and returns the report with the references and the key the server gave the build.
"""

from __future__ import annotations

import os
from pathlib import Path

from decodebench.building.build import ProgressCallback, build
from decodebench.building.cache import REPORT_NAME, BuildCache
from decodebench.building.sources import (
    Source,
    SourceError,
    UploadedCheckpoint,
    UploadedGguf,
    UploadedPackage,
    local_source,
)
from decodebench.client import DecodebenchClient
from decodebench.contracts.build import BuildReport
from decodebench.contracts.domain import CHAT_PROMPT_SET, CUSTOM_PROMPT_SET
from decodebench.contracts.uploads import UPLOAD_PREFIX, ModelKind
from decodebench.contracts.variants import build_key
from decodebench.contracts.workers import BuildAssignment
from decodebench.toolchain import ToolchainMismatch

CHECKPOINT_KINDS: dict[ModelKind, type[UploadedCheckpoint]] = {
    ModelKind.hf: UploadedCheckpoint,
    ModelKind.gguf: UploadedGguf,
}


def build_assignment(
    client: DecodebenchClient,
    assignment: BuildAssignment,
    work_dir: Path,
    out_dir: Path,
    progress: ProgressCallback,
) -> BuildReport:
    """The build the server assigned, in ``out_dir``, with its references; ``work_dir`` holds the
    worker's caches (builds and sensitivity rankings, fetched models, references)."""
    progress("fetch", 0.0)
    source = assignment_source(client, assignment, work_dir / "models")
    # The worker's own cache: a rebuilt variant is a hard link, and the per-layer sensitivity
    # ranking of a model is measured once for all its variants.
    cache = BuildCache(work_dir / "cache")
    report = build(source, assignment.variant, out_dir, progress, cache=cache)
    if assignment.prompt_set is not None:  # a model with a tokenizer
        progress("references", 1.0)
        report = with_references(
            report, source, assignment, out_dir, client, work_dir / "references"
        )
    if report.key != assignment.key:  # one key for one toolchain, on both sides
        raise ToolchainMismatch(
            f"this worker keys the build {report.key}, the server {assignment.key}"
        )
    return report


def assignment_source(client: DecodebenchClient, assignment: BuildAssignment, root: Path) -> Source:
    """The source of the assignment's model, chosen once from its spec."""
    model: Source
    if assignment.model.startswith(UPLOAD_PREFIX):
        view = client.get_model(assignment.model.removeprefix(UPLOAD_PREFIX))
        if view.kind not in CHECKPOINT_KINDS:
            raise SourceError(f"model {view.name} is a {view.kind.value}, not a checkpoint")
        model = CHECKPOINT_KINDS[view.kind](assignment.model, view, client, root)
    else:  # a preset, or a registry model (whose tokenizer a package's references need)
        model = local_source(assignment.model)
    if assignment.variant.package is None:
        return model
    package = client.get_model(assignment.variant.package)
    if package.kind != ModelKind.package:
        raise SourceError(f"package: {package.name} is not a .mlpackage")
    return UploadedPackage(model, package, client, root)


def with_references(
    report: BuildReport,
    source: Source,
    assignment: BuildAssignment,
    out_dir: Path,
    client: DecodebenchClient,
    cache: Path,
) -> BuildReport:
    from decodebench.building.reference import reference_set
    from decodebench.detokenize import dump_table
    from decodebench.prompts import chat_prompts

    request = assignment.prompt_set
    assert request is not None
    weights = source.weights
    if weights is None:
        raise SourceError(f"prompts: {assignment.model} has no tokenizer to reference them with")
    texts = request.texts or [prompt.text for prompt in chat_prompts(request.count)]
    identity = report.model_identity or report.model
    outputs, table = reference_set(
        weights,
        identity,
        texts,
        request.decode_tokens,
        request.identity,
        CUSTOM_PROMPT_SET if request.texts is not None else CHAT_PROMPT_SET,
        cache,
        # What the device is given: the prompt's last tokens that leave room for the answer.
        max_prompt_tokens=report.variant.context - request.decode_tokens,
    )
    if table is not None:
        table_file = cache / f"detokenizer-{identity}.json"
        if not table_file.is_file():
            partial = table_file.with_name(table_file.name + f".{os.getpid()}")
            partial.write_bytes(dump_table(table))
            partial.replace(table_file)
        outputs = outputs.model_copy(
            update={"detokenizer_sha256": client.upload_artifact(table_file)}
        )
    key = build_key(identity, report.variant, report.toolchain, request.identity)
    full = report.model_copy(update={"references": outputs, "key": key})
    partial_report = out_dir / f"{REPORT_NAME}.{os.getpid()}.partial"
    partial_report.write_text(full.model_dump_json(indent=2))
    partial_report.replace(out_dir / REPORT_NAME)
    return full
