"""Third-party import chatter goes to logging at DEBUG, never straight to a user's terminal.

Importing coremltools on Linux logs "Failed to load _MLModelProxy ..." once per native proxy
(the Core ML runtime is macOS-only), and "Torch version X has not been tested with coremltools"
when torch is newer than its tested pin; with coreai-opt installed, coremltools also imports
torchao, which logs that its GPU kernels (and Triton) cannot load, and scikit-learn's version
is "not supported". None of it says anything about the user's command.
:func:`route_import_noise` demotes exactly these records to DEBUG (they show with
``decodebench -v`` or ``DECODEBENCH_LOG=debug``); every other record and warning is untouched.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from typing import Any, TextIO

NOISE = re.compile(
    r"Failed to load _ML\w*Proxy|has not been tested with coremltools"
    r"|Failed to load \S*torchao\S*: Could not load this library|Detected no triton"
    r"|scikit-learn version \S+ is not supported"
    r"|is an Enum subclass and is now natively supported by torch.compile"
)
NOISY_LOGGERS = ("coremltools", "torchao", "torchao.kernel.intmm", "torch.utils._pytree")
LOG_ENV = "DECODEBENCH_LOG"
log = logging.getLogger(__name__)


class _DemoteNoise(logging.Filter):
    """A logger filter: import noise becomes a DEBUG record, kept only where DEBUG is on."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG or not NOISE.search(record.getMessage()):
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


_FILTER = _DemoteNoise()
_shown: list[Any] = []


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    if NOISE.search(str(message)):
        log.debug("%s: %s (%s:%d)", category.__name__, message, filename, lineno)
        return
    _shown[0](message, category, filename, lineno, file, line)


def route_import_noise() -> None:
    """Demote the import noise of coremltools (logged or warned) to DEBUG; idempotent."""
    for name in NOISY_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    if not _shown:
        _shown.append(warnings.showwarning)
        warnings.showwarning = _show_warning


def debug_requested(flag: bool) -> bool:
    """``-v``/``--debug`` on the command line, or ``DECODEBENCH_LOG=debug`` in the environment."""
    return flag or os.environ.get(LOG_ENV, "").strip().lower() == "debug"


def configure_cli_logging(debug: bool) -> None:
    """The CLI prints its own stages. Without ``debug`` coremltools says only its errors (no
    per-pass warnings, no progress bars); with it every DEBUG record reaches stderr, import
    noise included."""
    route_import_noise()
    os.environ.setdefault("TQDM_DISABLE", "1")
    if debug:
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
        for name in NOISY_LOGGERS:
            logging.getLogger(name).setLevel(logging.NOTSET)
    else:
        for name in NOISY_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
