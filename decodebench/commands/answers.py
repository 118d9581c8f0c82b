"""A sweep's answers as text for a terminal: the fp32 reference beside each variant's."""

from __future__ import annotations

from decodebench.contracts.api import SweepDetail


def _indented(text: str) -> list[str]:
    # The answer as decoded, line breaks and special tokens (<|im_end|>) included.
    return [f"    {line}" for line in (text.splitlines() or [""])]


def format_answers(sweep: SweepDetail) -> str:
    """Nothing for sweeps of models without a tokenizer (no reference, no text)."""
    answers = sweep.answers
    if answers is None:
        return ""
    lines = [f"answers: {answers.decode_tokens} greedy tokens per prompt"]
    for prompt in answers.prompts:
        lines.append(f"prompt {prompt.index + 1}: {prompt.prompt}")
        lines.append(f"  reference ({answers.reference}):")
        lines.extend(_indented(prompt.reference))
        for answer in prompt.answers:
            if answer.text is None:
                lines.append(f"  {answer.variant}: no token ids recorded")
                continue
            verdict = (
                "the reference's tokens"
                if answer.first_divergence is None
                else f"differs from token {answer.first_divergence + 1}"
            )
            lines.append(f"  {answer.variant} on {answer.device_class} ({verdict}):")
            lines.extend(_indented(answer.text))
    lines.append("agreement with the fp32 reference:")
    for row in sweep.results:
        agreement = row.reference_agreement
        figure = (
            "not recorded (no token ids)"
            if agreement is None
            else f"{agreement.identical_share:.0%} of {agreement.prompts_compared} prompts identical"
        )
        lines.append(f"  {row.device_class:16s} {row.variant:28s} {figure}")
    if answers.note:
        lines.append(f"note: {answers.note}")
    return "\n".join(lines)
