"""Write a job.json for a manual smoke test of the harness on a phone (ios_harness/README.md).

    python ios_harness/make_job.py out/tiny --prompts 2 --decode-tokens 8 > job.json

OUT is a `decodebench build --out` folder (its build.json gives the model, the variant and the
bytes per token). The job names the package as `models/smoke/model.mlpackage`, where the README's
push commands put it, or, for a Core AI build (OUT holds `model.aimodel`), as
`models/smoke/model.aimodel` with engine coreai. Exits 2 with a one-line message on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import ValidationError

from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.names import ARTIFACT_NAMES, FormatName
from decodebench.contracts.presets import get_preset
from decodebench.harness import HarnessJob, HarnessPrompt
from decodebench.prompts import PROMPT_SET_VERSION, builtin_prompts

SMOKE_DIR = "models/smoke"


def smoke_job(out: Path, prompts: int, decode_tokens: int, run_id: int) -> HarnessJob:
    report = json.loads((out / "build.json").read_text())
    variant = VariantSpec.model_validate(report["variant"])
    room = variant.context - decode_tokens + 1
    vocab_size = get_preset(report["model"]).vocab_size
    coreai = (out / ARTIFACT_NAMES[FormatName.coreai]).exists()
    engine = FormatName.coreai if coreai else FormatName.coreml
    return HarnessJob(
        run_id=run_id,
        model=report["model"],
        variant_label=variant.label,
        device_class="manual",
        driver="manual",
        artifact_sha256="smoke",
        package_path=f"{SMOKE_DIR}/{ARTIFACT_NAMES[engine]}",
        engine=engine.value,
        bytes_per_token=report["analysis"]["bytes_per_token"]["total"],
        context_tokens=variant.context,
        decode_tokens=decode_tokens,
        prompt_set_version=PROMPT_SET_VERSION,
        variant=variant,
        prompts=[
            HarnessPrompt(index=prompt.index, token_ids=prompt.token_ids(vocab_size)[-room:])
            for prompt in builtin_prompts(prompts)
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="a decodebench build --out folder")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--decode-tokens", type=int, default=8)
    parser.add_argument("--run-id", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        job = smoke_job(args.out, args.prompts, args.decode_tokens, args.run_id)
    except ValidationError as error:  # its first line only counts the errors: say the first
        print(f"make_job: {error.errors()[0]['msg']}".splitlines()[0], file=sys.stderr)
        return 2
    except (OSError, KeyError, ValueError) as error:
        print(f"make_job: {error}".splitlines()[0], file=sys.stderr)
        return 2
    print(job.model_dump_json(indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
