"""Defaults shared by the verify library and its CLI (kept import-light for the CLI parser)."""

DEFAULT_PROMPT = (1, 2, 3, 4)
# The same function in fp16 differs between two programs by a few ulps per layer; different
# functions (a wrong head mapping, mixed heads) differ by orders of magnitude more.
# Absolute plus relative to the step's largest logit: real checkpoints have logits of 10-30.
DEFAULT_ATOL = 0.02
DEFAULT_RTOL = 0.01
