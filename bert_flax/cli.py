"""What the command-line programs (`bert_flax.main`, `bert_flax.finetune`) share: how a run
that cannot go on ends.

- A user error (a `ValueError` or `FileNotFoundError` raised by this project's own checks: a
  labelled file without a `label` column, an empty split, a warm-up longer than the run, a
  missing data directory, ...) ends with its message as one line on stderr and exit status 2,
  without a traceback. `BERT_FLAX_TRACEBACK=1` shows the traceback too.
- A checkpoint that cannot be saved (a full disk), one that does not restore though its files
  show no damage (an I/O error), or none that restores (`checkpointing.CheckpointError`), and a
  full disk under any other file (metrics, plots), end the same way, exit status 2.
- A diverged run (`train.TrainingDiverged`) ends with its message and exit status 3.
- Anything else (a failure inside a library, a bug) keeps its traceback.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable

from absl import app, logging

from bert_flax import checkpointing, train

USER_ERROR_EXIT_STATUS = 2
DIVERGED_EXIT_STATUS = 3
# Top-level packages of this project: an error raised in them is one of its own checks.
_OWN_PACKAGES = ("bert_flax", "configs", "optim", "packing")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def run(main: Callable[[list[str]], None], **kwargs) -> None:
    """`absl.app.run(main)`, ending user errors and divergence as the module docstring says."""

    def guarded(argv: list[str]) -> None:
        try:
            main(argv)
        except train.TrainingDiverged as error:
            logging.error("%s", error)
            _exit(str(error), DIVERGED_EXIT_STATUS)
        except checkpointing.CheckpointError as error:
            _exit(f"error: {error}", USER_ERROR_EXIT_STATUS)
        except OSError as error:
            if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            _exit(
                f"error: {error}; free space and rerun the same command (it resumes from the "
                "latest complete checkpoint).",
                USER_ERROR_EXIT_STATUS,
            )
        except (ValueError, FileNotFoundError) as error:
            if not is_user_error(error) or os.environ.get("BERT_FLAX_TRACEBACK"):
                raise
            _exit(f"error: {error}", USER_ERROR_EXIT_STATUS)

    app.run(guarded, **kwargs)


def _exit(message: str, status: int) -> None:
    """Prints `message` as one line and exits at once: the interpreter's teardown would add
    library noise (orbax's background threads, tf.data) after the line that matters."""
    logging.flush()
    print(" ".join(message.split()), file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(status)
