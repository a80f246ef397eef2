"""The exception types every layer raises, and how a program that meets one ends. Every program
a user types (`bert_flax.train`, `.data.create_pretraining_data`,
`.data.verify_packing`, `.convert`, `.profile`, `.demo`, `.aot`, `python -m packing`) runs its
main through `run` (absl) or `guard`.

- A user error ends with its message as one line on stderr and exit status 2, without a
  traceback: a `ValueError` or `FileNotFoundError` raised by this project's own checks (a
  labelled file without a `label` column, an empty split, a warm-up longer than the run, a
  missing data directory, ...), and a path the system refuses wherever it is met (missing, a
  directory for a file or the reverse, not writable). `BERT_FLAX_TRACEBACK=1` prints the
  traceback before the line.
- A checkpoint that cannot be saved (a full disk), one that does not restore though its files
  show no damage (an I/O error), or none that restores (`CheckpointError`), and a
  full disk under any other file (metrics, plots), end the same way, exit status 2.
- A diverged run (`TrainingDiverged`) ends with its message and exit status 3.
- Anything else (a failure inside a library, a bug) keeps its traceback.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from absl import app, logging

USER_ERROR_EXIT_STATUS = 2
DIVERGED_EXIT_STATUS = 3
# Top-level packages of this project: an error raised in them is one of its own checks.
_OWN_PACKAGES = ("bert_flax", "configs", "optim", "packing")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the system says of a path a user gave: missing, the wrong kind, not writable.
_PATH_ERRNOS = (errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS)
_FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class TrainingDiverged(RuntimeError):
    """Too many consecutive steps with a non-finite loss or gradient (none of them applied)."""


class CheckpointError(RuntimeError):
    """No checkpoint of a run restores, or one could not be saved."""


class CheckpointMismatch(ValueError):
    """A readable checkpoint whose arrays do not fit the state (another model or optimizer)."""


def is_user_error(error: BaseException) -> bool:
    """Whether `error` is a ValueError/FileNotFoundError raised by this project's own code."""
    if not isinstance(error, (ValueError, FileNotFoundError)):
        return False
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    if frame is None:
        return False
    relative = os.path.relpath(os.path.abspath(frame.tb_frame.f_code.co_filename), _ROOT)
    return relative.split(os.sep)[0] in _OWN_PACKAGES


def check_writable_dir(directory: str) -> None:
    """ValueError, before any work, unless `directory` is or can be made a writable directory
    (its nearest existing ancestor is one): for a program's output."""
    existing = os.path.abspath(directory)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK):
        raise ValueError(f"{directory} cannot be written: {existing} is not a writable directory.")


def outcome(error: BaseException) -> tuple[int, str] | None:
    """(exit status, line) that `error` ends a program with, or None to keep its traceback."""
    if isinstance(error, TrainingDiverged):
        logging.error("%s", error)
        return DIVERGED_EXIT_STATUS, str(error)
    if isinstance(error, CheckpointError):
        return USER_ERROR_EXIT_STATUS, f"error: {error}"
    if isinstance(error, OSError) and error.errno in _FULL_DISK_ERRNOS:
        return USER_ERROR_EXIT_STATUS, (
            f"error: {error}; free space and rerun the same command (it resumes from the "
            "latest complete checkpoint)."
        )
    if isinstance(error, OSError) and error.errno in _PATH_ERRNOS:
        return USER_ERROR_EXIT_STATUS, f"error: {error}"
    if is_user_error(error):
        return USER_ERROR_EXIT_STATUS, f"error: {error}"
    return None


def guard(main: Callable[..., Any]) -> Callable[..., Any]:
    """`main`, ending its errors as `outcome` says (`BERT_FLAX_TRACEBACK=1`: the traceback
    first, then the line and the same exit status)."""

    def guarded(*args: Any) -> Any:
        try:
            return main(*args)
        except Exception as error:
            ending = outcome(error)
            if ending is None:
                raise
            if os.environ.get("BERT_FLAX_TRACEBACK"):
                traceback.print_exc()
            _exit(*ending)

    return guarded


def run(main: Callable[[list[str]], None], **kwargs) -> None:
    """`absl.app.run(main)` with `main` guarded (the module docstring)."""
    app.run(guard(main), **kwargs)


def _exit(status: int, message: str) -> None:
    """Prints `message` as one line and exits at once: the interpreter's teardown would add
    library noise (orbax's background threads, tf.data) after the line that matters. The line
    starts with a newline, in one write: a background thread's output may have stopped mid-line."""
    logging.flush()
    sys.stderr.write("\n" + " ".join(message.split()) + "\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(status)
