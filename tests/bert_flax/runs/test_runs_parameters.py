"""Parameters from anything: what a path holds, a workdir's checkpoint restored parameters only
(equal to the saved state's), bert_flax directories round-trip with shape checks, the best
parameters kept by the metric's direction."""

from __future__ import annotations

import errno
import json

import flax.traverse_util
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bert_flax import errors
from bert_flax.convert.hugging_face import config_to_hf
from bert_flax.convert.tables import expected_shapes
from bert_flax.input_pipeline.contract import SUMMARY_FILE
from bert_flax.model.config import BertConfig
from bert_flax.runs import checkpoint_files, parameters, pretrained

CONFIG = BertConfig.preset(
    "tiny",
    vocab_size=64,
    hidden_size=16,
    num_layers=1,
    num_heads=2,
    intermediate_size=32,
)


def random_params(config: BertConfig, seed: int = 0) -> dict:
    """A parameter tree of `BertForPreTraining(config)`'s shapes, normal random values."""
    rng = np.random.default_rng(seed)
    flat = {k: rng.normal(size=s).astype(np.float32) for k, s in expected_shapes(config).items()}
    return flax.traverse_util.unflatten_dict(flat, sep="/")


def test_checkpoint_kind_by_what_a_directory_holds(tmp_path):

    kinds = {
        "workdir": ["checkpoints/", "config.json", "bert_config.json"],
        "bert_flax": ["params.msgpack", "bert_config.json"],
        "hf": ["config.json", "model.safetensors"],
        "tf": ["bert_model.ckpt.index", "bert_config.json"],
    }
    for kind, files in kinds.items():
        folder = tmp_path / kind
        for name in files:
            target = folder / name
            if name.endswith("/"):
                target.mkdir(parents=True)
            else:
                folder.mkdir(parents=True, exist_ok=True)
                target.write_text("")
        assert pretrained.checkpoint_kind(str(folder)) == kind
    with pytest.raises(FileNotFoundError, match="is none of"):
        pretrained.checkpoint_kind(str(tmp_path))
    with pytest.raises(ValueError, match="selects a workdir's checkpoint"):
        pretrained.load_pretrained(str(tmp_path / "hf"), step=3)


def save_run(workdir: str, steps: tuple[int, ...]) -> None:
    """Checkpoints of `steps` in `workdir`, each with its own parameters (`random_params` seeded
    by the step) and optimizer state."""
    manager = ocp.CheckpointManager(
        checkpoint_files.checkpoint_dir(workdir),
        item_names=checkpoint_files.ITEMS,
        item_handlers=checkpoint_files.item_handlers(),
    )
    for step in steps:
        state = {
            "params": random_params(CONFIG, seed=step),
            "opt_state": {"mu": np.ones((5, 7), np.float32)},
            "step": step,
        }
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state), progress=ocp.args.JsonSave({"step": step})
        )
        manager.save(step, args=args)
    manager.wait_until_finished()
    manager.close()


def test_a_workdir_restores_its_parameters_alone(tmp_path):
    """Steps 2 and 4 hold different parameters: the latest (4) by default, 2 when asked."""
    save_run(str(tmp_path), (2, 4))
    (tmp_path / parameters.CONFIG_FILE).write_text(json.dumps(CONFIG.to_dict()))

    config, restored = checkpoint_files.load_workdir(str(tmp_path))
    assert config == CONFIG
    assert restored.keys() == random_params(CONFIG).keys()  # parameters only, no optimizer state
    jax.tree.map(np.testing.assert_array_equal, restored, random_params(CONFIG, seed=4))
    step, restored = checkpoint_files.restore_params(str(tmp_path), 2)
    assert step == 2
    jax.tree.map(np.testing.assert_array_equal, restored, random_params(CONFIG, seed=2))
    with pytest.raises(ValueError, match="no checkpoint of step 3"):
        checkpoint_files.restore_params(str(tmp_path), 3)


def test_a_workdir_read_that_fails_without_damage_is_an_error(tmp_path, monkeypatch):
    """An I/O error reading the newest checkpoint is a CheckpointError, not the older one."""
    save_run(str(tmp_path), (2, 4))

    def fail(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(ocp.PyTreeCheckpointHandler, "restore", fail)
    with pytest.raises(errors.CheckpointError, match=r"step 4 .*Input/output.*Rerun"):
        checkpoint_files.restore_params(str(tmp_path))


def test_a_bert_flax_directory_round_trips_and_names_a_misfit(tmp_path):
    params = random_params(CONFIG)
    parameters.save_params(params, CONFIG, str(tmp_path / "model"))
    config, loaded = parameters.load_params(str(tmp_path / "model"))
    assert config == CONFIG
    jax.tree.map(np.testing.assert_array_equal, loaded, params)
    bigger = CONFIG.replace(intermediate_size=48)
    parameters.save_params(params, bigger, str(tmp_path / "misfit"))
    with pytest.raises(
        ValueError, match=r"intermediate.*has shape \(16, 32\), the model \(16, 48\)"
    ):
        parameters.load_params(str(tmp_path / "misfit"))


def test_a_checkpoints_config_and_vocabulary_are_read_without_its_weights(tmp_path):
    """Every kind's BertConfig from its config file alone (the weight files are empty: reading
    them would fail); the vocabulary a run was trained with is its prepared data's, a directory's
    the vocab.txt beside its weights, else none."""
    config = CONFIG.replace(pre_layer_norm=True, relative_attention_buckets=8)
    run, data = tmp_path / "run", tmp_path / "data"
    (run / "checkpoints").mkdir(parents=True)
    data.mkdir()
    (run / parameters.CONFIG_FILE).write_text(json.dumps(config.to_dict()))
    (run / "config.json").write_text(json.dumps({"data": {"data_dir": str(data)}}))
    (data / SUMMARY_FILE).write_text(json.dumps({"vocab": {"path": "/corpus/vocab.txt"}}))
    assert pretrained.pretrained_config(str(run)) == config
    assert pretrained.pretrained_vocab_file(str(run)) == "/corpus/vocab.txt"

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(config_to_hf(CONFIG)))
    (hf / "model.safetensors").write_text("")
    assert pretrained.pretrained_config(str(hf)) == CONFIG
    assert pretrained.pretrained_vocab_file(str(hf)) is None
    (hf / "vocab.txt").write_text("[PAD]\n")
    assert pretrained.pretrained_vocab_file(str(hf)) == str(hf / "vocab.txt")

    tf = tmp_path / "tf"
    tf.mkdir()
    (tf / "bert_model.ckpt.index").write_text("")
    google = {k: v for k, v in config_to_hf(CONFIG).items() if k != "architectures"}
    (tf / "bert_config.json").write_text(json.dumps(google))
    assert pretrained.pretrained_config(str(tf)).num_layers == CONFIG.num_layers
    with pytest.raises(FileNotFoundError, match="is none of"):
        pretrained.pretrained_config(str(data))


@pytest.mark.parametrize(
    "mode,values,kept", [("max", [0.5, 0.4, 0.7], 0.7), ("min", [0.5, 0.6, 0.2], 0.2)]
)
def test_best_params_keep_the_best_by_the_metric_direction(tmp_path, mode, values, kept):
    best = parameters.BestParams(str(tmp_path), metric="accuracy", mode=mode, enabled=True)
    for step, value in enumerate(values):
        params = random_params(CONFIG, seed=step)
        best.offer(step, {"accuracy": value}, params, CONFIG, {"num_labels": 2})
    assert not best.offer(9, {"accuracy": float("nan")}, params, CONFIG, {})
    record = json.loads((tmp_path / parameters.BEST_DIR / parameters.BEST_FILE).read_text())
    assert record["value"] == kept and record["num_labels"] == 2
    _, loaded, head = parameters.load_finetuned(str(tmp_path))
    want = random_params(CONFIG, seed=values.index(kept))
    jax.tree.map(np.testing.assert_array_equal, loaded, want)
    assert head["step"] == values.index(kept)
    resumed = parameters.BestParams(str(tmp_path), metric="accuracy", mode=mode, enabled=True)
    assert resumed.record["value"] == kept  # a resumed run competes with its earlier best
