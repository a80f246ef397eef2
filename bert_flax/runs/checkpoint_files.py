"""A run's checkpoint directory (`workdir/checkpoints`, orbax): its layout, what shows a checkpoint
damaged (`damage`, from its files without reading the arrays), and a run's parameters read back
(`restore_params`, `load_workdir`). Saving and resuming the whole train state is
`bert_flax.train.resume`.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts
from absl import logging
from etils import epath

from bert_flax import errors
from bert_flax.model.config import BertConfig
from bert_flax.runs import parameters
from bert_flax.runs.parameters import Params

ITEMS = ("state", "progress")
CORRUPT_DIR = "corrupt"  # under checkpoints/: damaged checkpoints moved aside on resume


def item_handlers() -> dict[str, Any]:
    """How each item is written and read (named, so that metadata reads without a target)."""
    return {"state": ocp.StandardCheckpointHandler(), "progress": ocp.JsonCheckpointHandler()}


# tensorstore appends the spec of what it was opening (a JSON of a few KB) after the cause.
TENSORSTORE_SPEC = re.compile(r"\s*\[tensorstore_spec='.*?'\]")


def short_reason(error: Exception, limit: int = 300) -> str:
    """The first line of `error` without tensorstore's spec, its middle elided past `limit`
    characters (tensorstore's messages put the cause, e.g. "No space left on device", last)."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
    text = TENSORSTORE_SPEC.sub("", text)
    return text if len(text) <= limit else f"{text[: limit // 3]} ... {text[-2 * limit // 3 :]}"


def saved_misfits(directory: str, step: int, target: Any, part: str | None = None) -> list[str]:
    """The arrays of `target` (a state, or its `part` such as "params"; arrays or shape structs)
    that checkpoint `step` lacks, has extra or shapes otherwise, from its metadata alone; [] when
    they fit or the metadata does not read (restoring then says what is wrong)."""
    handler = item_handlers()["state"]  # not a manager: making one is a barrier of all processes
    try:
        saved = handler.metadata(epath.Path(directory) / str(step) / "state").tree
        saved = saved[part] if part else saved
    except Exception:  # orbax and tensorstore raise many kinds for bad files
        return []
    finally:
        handler.close()
    return parameters.misfits(_shapes(saved), _shapes(target), f"step {step}")


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """{"params/bert/...": shape} of a tree of arrays, shape structs or orbax's array metadata,
    its leaves named as orbax names them (a TrainState too, unlike `parameters.flat_shapes`)."""
    return {"/".join(k): tuple(v.shape) for k, v in ocp.tree.to_flat_dict(tree).items()}


# What orbax 0.12 writes under a step's directory and reads back before any array.
STATE_METADATA = os.path.join("state", "_METADATA")
PROGRESS_FILE = os.path.join("progress", "metadata")
OCDBT_DAMAGE = ("NOT_FOUND", "DATA_LOSS", "OUT_OF_RANGE")  # tensorstore's codes for bad files


def damage(directory: str, step: int) -> str | None:
    """What shows checkpoint `step` in `directory` damaged, from its files without reading its
    arrays: a metadata file missing or not JSON, an OCDBT manifest or B-tree node missing or not
    decoding, an array file missing or shorter than what refers to it. None when nothing shows
    damage, also when the check itself fails (an I/O error is no sign of damage)."""
    path = os.path.join(directory, str(step))
    try:
        for name in (PROGRESS_FILE, STATE_METADATA):
            with open(os.path.join(path, name)) as f:
                metadata = json.load(f)  # the state's, read last, says if it is OCDBT
    except (FileNotFoundError, NotADirectoryError, ValueError) as error:  # missing, not JSON
        return f"{name}: {type(error).__name__}: {short_reason(error)}"
    except OSError as error:
        return _unchecked(step, error)
    try:
        return _ocdbt_damage(os.path.join(path, "state")) if metadata.get("use_ocdbt") else None
    except Exception as error:  # tensorstore raises ValueError for I/O errors too
        return _unchecked(step, error)


def _unchecked(step: int, error: Exception) -> None:
    logging.warning("Could not check the files of checkpoint %d: %s", step, short_reason(error))


def _ocdbt_damage(path: str) -> str | None:
    """The first B-tree node or array value of the OCDBT database at `path` whose file is
    missing or short, or a manifest or node that does not decode (each node is decoded, no value
    is read); None when all are whole. Other errors (I/O) propagate."""
    base = ts.KvStore.open({"driver": "file", "path": path + os.sep}).result()
    sizes: dict[str, int] = {}
    try:
        versions = ts.ocdbt.dump(base).result()["versions"]
        pending = [versions[-1]["root"].get("location")] if versions else []
        while pending:
            location = pending.pop()
            if location is None:  # an empty tree
                continue
            kind, prefix, name, offset, length = location.split(":")
            file, end = os.path.join(path, prefix + name), int(offset) + int(length)
            if file not in sizes:
                sizes[file] = os.path.getsize(file) if os.path.isfile(file) else -1
            if sizes[file] < end:
                found = "missing" if sizes[file] < 0 else f"{sizes[file]} bytes"
                return f"{file} is {found}, a {kind} in it ends at byte {end}"
            if kind == "btreenode":
                entries = ts.ocdbt.dump(base, location).result()["entries"]
                pending += [e.get("location") or e.get("indirect_value") for e in entries]
    except ValueError as error:  # tensorstore's errors, by their status code
        if str(error).startswith(OCDBT_DAMAGE):
            return short_reason(error)
        raise
    return None


def checkpoint_dir(workdir: str) -> str:
    return os.path.abspath(os.path.join(workdir, "checkpoints"))


def read_failed(directory: str, step: int, reason: str) -> errors.CheckpointError:
    """The error for checkpoint `step` that did not restore while its files show no damage."""
    return errors.CheckpointError(
        f"Reading the checkpoint of step {step} in {directory} failed ({reason}); its files "
        "show no damage, so it is left in place and no older checkpoint is used instead. A "
        "transient failure (an I/O error, out of memory)? Rerun the same command to retry; if it "
        f"fails the same way again, move {os.path.join(directory, str(step))} into "
        f"{os.path.join(directory, CORRUPT_DIR)}/ to use the checkpoint before it."
    )


def restore_params(workdir: str, step: int | None = None) -> tuple[int, Params]:
    """(step, parameters as numpy) of a run's checkpoint: `step`, or the newest that restores
    (one whose files show damage is reported and skipped, left in place: this is another run's
    workdir; any other failure is a CheckpointError). Only the parameters are read (orbax partial
    restore), onto one device whatever mesh wrote them."""
    directory = checkpoint_dir(workdir)
    # PyTreeCheckpointHandler reads what StandardCheckpointHandler wrote and restores subtrees.
    handlers = {**item_handlers(), "state": ocp.PyTreeCheckpointHandler()}
    manager = ocp.CheckpointManager(directory, item_names=ITEMS, item_handlers=handlers)
    try:
        steps = sorted(manager.all_steps(), reverse=True)
        if not steps:
            raise FileNotFoundError(f"{directory} holds no checkpoint (is {workdir} a run?).")
        if step is not None and step not in steps:
            raise ValueError(f"{directory} has no checkpoint of step {step}; it has {steps}.")
        damaged = []
        for candidate in [step] if step is not None else steps:
            try:
                return candidate, _read_params_only(manager, candidate)
            except Exception as error:  # orbax and tensorstore raise many kinds for bad files
                shown = damage(directory, candidate)
                if shown is None:
                    reason = f"{type(error).__name__}: {short_reason(error)}"
                    raise read_failed(directory, candidate, reason) from error
                damaged.append(f"step {candidate}: {shown}"[:400])
                logging.warning("Checkpoint %s of %s is damaged: %s", candidate, directory, shown)
        raise errors.CheckpointError(f"No checkpoint in {directory} restores: {'; '.join(damaged)}")
    finally:
        manager.close()


def _read_params_only(manager: ocp.CheckpointManager, step: int) -> Params:
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    saved = manager.item_metadata(step)["state"].tree["params"]
    target = {
        "params": jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), saved)
    }
    restore_args = jax.tree_util.tree_map(lambda _: ocp.ArrayRestoreArgs(sharding=device), target)
    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(target, restore_args=restore_args, partial_restore=True)
        ),
    )
    return jax.tree_util.tree_map(np.asarray, restored["state"]["params"])


def load_workdir(workdir: str, step: int | None = None) -> tuple[BertConfig, Params]:
    """A training run's parameters (checkpoint `step`, default the latest) and its BertConfig
    (the `bert_config.json` the run wrote)."""
    config = parameters.read_config(workdir)
    step, params = restore_params(workdir, step)
    logging.info("Read the parameters of step %d from %s", step, workdir)
    return config, params
