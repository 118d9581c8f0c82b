"""Greedy tokens back into text without a tokenizer library: a table of each token id's bytes.

The server must not import transformers, yet the sweep page shows what each variant answered.
The worker, which has the model's tokenizer, writes the table once per model
(:func:`decodebench.building.reference.detokenizer_table`) into the artifact store; decoding is then a
concatenation of byte strings and one UTF-8 decode, exactly what a byte-level BPE tokenizer's
decoder does (the worker checks the table reproduces the tokenizer on every reference answer).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

TABLE_FORMAT = "decodebench-detokenizer-v1"
UNKNOWN = "\N{REPLACEMENT CHARACTER}"


class DetokenizerError(ValueError):
    """A table that does not read as one."""


def dump_table(pieces: Sequence[bytes]) -> bytes:
    return json.dumps(
        {"format": TABLE_FORMAT, "tokens": [piece.hex() for piece in pieces]},
        separators=(",", ":"),
    ).encode()


def load_table(data: bytes) -> list[bytes]:
    try:
        document = json.loads(data)
        if document.get("format") != TABLE_FORMAT:
            raise DetokenizerError(f"not a {TABLE_FORMAT} table")
        return [bytes.fromhex(piece) for piece in document["tokens"]]
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        if isinstance(error, DetokenizerError):
            raise
        raise DetokenizerError(f"unreadable detokenizer table: {error}") from None


def detokenize(table: Sequence[bytes], token_ids: Sequence[int]) -> str:
    """The text of ``token_ids``; an id outside the table reads as U+FFFD, as do broken bytes."""
    unknown = UNKNOWN.encode()
    data = b"".join(table[token] if 0 <= token < len(table) else unknown for token in token_ids)
    return data.decode("utf-8", errors="replace")
