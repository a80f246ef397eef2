"""Any checkpoint a run can start from (`config.init_from`), by what its path holds:

    config, params = load_pretrained("/ckpt/bert-base-uncased")   # Hugging Face
    config, params = load_pretrained("workdir/tiny", step=2000)    # a run's checkpoint
    config = pretrained_config("/ckpt/uncased_L-12_H-768_A-12")    # Google BERT, weights unread

`checkpoint_kind` says what a path holds: a `bert_flax.train.loop` workdir (its orbax checkpoints;
only the parameters are restored), a bert_flax directory (`params.msgpack` + `bert_config.json`),
a Hugging Face directory or a Google BERT checkpoint (`bert_flax.convert`).
"""

from __future__ import annotations

import glob
import json
import os

from bert_flax.convert import google_bert, hugging_face
from bert_flax.input_pipeline.contract import SUMMARY_FILE, PreparedData
from bert_flax.model.config import BertConfig
from bert_flax.runs import checkpoint_files, parameters
from bert_flax.runs.parameters import Params


def checkpoint_kind(path: str) -> str:
    """ "workdir", "bert_flax", "hf" or "tf": what `path` holds."""
    if os.path.isdir(checkpoint_files.checkpoint_dir(path)):
        return "workdir"
    if os.path.isfile(os.path.join(path, parameters.PARAMS_FILE)):
        return "bert_flax"
    if os.path.isfile(os.path.join(path, "config.json")):
        return "hf"
    if glob.glob(os.path.join(path, "*.index")) or glob.glob(path + ".index"):
        return "tf"
    raise FileNotFoundError(
        f"{path!r} is none of: a bert_flax.train workdir (checkpoints/), a bert_flax directory "
        f"({parameters.PARAMS_FILE}), a Hugging Face directory (config.json + weights), a Google "
        "BERT checkpoint (*.index + bert_config.json)."
    )


def pretrained_config(path: str) -> BertConfig:
    """The BertConfig of any checkpoint `checkpoint_kind` recognises, its parameters unread
    (what `config.model.preset="init_from"` builds on)."""
    kind = checkpoint_kind(path)
    if kind in ("workdir", "bert_flax"):
        return parameters.read_config(path)
    if kind == "hf":
        return hugging_face.read_hf_config(path)
    return google_bert.read_tf_config(path)


def _run_data(path: str) -> PreparedData | None:
    """The prepared data a run at `path` read (its config.json's data_dir), if it says."""
    run_config = os.path.join(path, "config.json")
    if checkpoint_kind(path) != "workdir" or not os.path.isfile(run_config):
        return None
    with open(run_config) as f:
        data_dir = json.load(f).get("data", {}).get("data_dir") or ""
    if data_dir and os.path.isfile(os.path.join(data_dir, SUMMARY_FILE)):
        return PreparedData.load(data_dir)
    return None


def _beside(path: str, name: str) -> str | None:
    """The file `name` beside the weights at `path`, if there is one."""
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    found = os.path.join(folder, name)
    return found if os.path.isfile(found) else None


def pretrained_vocab_file(path: str) -> str | None:
    """The WordPiece vocabulary the checkpoint at `path` was trained with, where it says: a
    run's prepared data's (its config.json's data_dir), else a vocab.txt beside the weights;
    None if neither."""
    data = _run_data(path)
    if data is not None and data.vocab_file:
        return data.vocab_file
    return _beside(path, "vocab.txt")


def pretrained_lowercase(path: str) -> bool | None:
    """Whether the checkpoint at `path` reads lower-cased text, where it says: a run's prepared
    data's summary, else the `do_lower_case` of a `tokenizer_config.json` beside the weights (a
    Hugging Face folder's); None if neither."""
    data = _run_data(path)
    if data is not None and "lowercase" in data.summary.get("vocab", {}):
        return bool(data.summary["vocab"]["lowercase"])
    tokenizer_config = _beside(path, "tokenizer_config.json")
    if tokenizer_config is None:
        return None
    with open(tokenizer_config) as f:
        lowercase = json.load(f).get("do_lower_case")
    return None if lowercase is None else bool(lowercase)


def load_pretrained(path: str, step: int | None = None) -> tuple[BertConfig, Params]:
    """(BertConfig, params) from any checkpoint `checkpoint_kind` recognises; `step` picks a
    workdir's checkpoint (default the latest)."""
    kind = checkpoint_kind(path)
    if step is not None and kind != "workdir":
        raise ValueError(f"A step ({step}) selects a workdir's checkpoint; {path!r} is {kind}.")
    if kind == "workdir":
        return checkpoint_files.load_workdir(path, step)
    if kind == "bert_flax":
        return parameters.load_params(path)
    if kind == "hf":
        return hugging_face.load_hf_checkpoint(path)
    return google_bert.load_tf_checkpoint(path)
