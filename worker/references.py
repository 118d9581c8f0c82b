"""Reference outputs for a build of a model with a tokenizer (SmolLM2 …), next to its package.

The assignment names the prompts (the built-in chat set or the sweep's own texts) and the decode
length; the worker tokenizes them with the model's chat template, lets transformers decode them
greedily in fp32 (cached by model, prompts and decode length under the worker's folder, so a
sweep's variants compute them once), uploads the model's detokenizer table to the artifact store
and returns the report with the references and the key the server gave the build.
"""

from __future__ import annotations

import os
from pathlib import Path

from decodebench.building.cache import REPORT_NAME
from decodebench.client import DecodebenchClient
from decodebench.contracts.build import BuildReport
from decodebench.contracts.domain import CHAT_PROMPT_SET, CUSTOM_PROMPT_SET, build_key
from decodebench.contracts.workers import BuildAssignment


def with_references(
    report: BuildReport,
    assignment: BuildAssignment,
    out_dir: Path,
    client: DecodebenchClient,
    cache: Path,
) -> BuildReport:
    from decodebench.building.realmodels import fetch_model
    from decodebench.building.reference import reference_set
    from decodebench.detokenize import dump_table
    from decodebench.prompts import chat_prompts

    request = assignment.prompt_set
    assert request is not None
    if report.weights_path is not None:
        weights = Path(report.weights_path)
    else:
        weights = fetch_model(assignment.model)
    texts = request.texts or [prompt.text for prompt in chat_prompts(request.count)]
    outputs, table = reference_set(
        weights,
        report.model_identity or report.model,
        texts,
        request.decode_tokens,
        request.identity,
        CUSTOM_PROMPT_SET if request.texts is not None else CHAT_PROMPT_SET,
        cache,
        # What the device is given: the prompt's last tokens that leave room for the answer.
        max_prompt_tokens=report.variant.context - request.decode_tokens,
    )
    if table is not None:
        table_file = cache / f"detokenizer-{report.model_identity or report.model}.json"
        if not table_file.is_file():
            partial = table_file.with_name(table_file.name + f".{os.getpid()}")
            partial.write_bytes(dump_table(table))
            partial.replace(table_file)
        outputs = outputs.model_copy(
            update={"detokenizer_sha256": client.upload_artifact(table_file)}
        )
    key = build_key(
        report.model_identity or report.model, report.variant, report.toolchain, request.identity
    )
    full = report.model_copy(update={"references": outputs, "key": key})
    partial_report = out_dir / f"{REPORT_NAME}.{os.getpid()}.partial"
    partial_report.write_text(full.model_dump_json(indent=2))
    partial_report.replace(out_dir / REPORT_NAME)
    return full
