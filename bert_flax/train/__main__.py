r"""Pre-train BERT from a config file:

  python -m bert_flax.train --config=configs/tiny.py --workdir=workdir/tiny \
      --config.data.data_dir=workdir/sotu_128 [--config.train.steps=100 ...]

Any field of the config can be set with `--config.FIELD=VALUE` (e.g. `--config.model.num_layers=4`,
`--config.optimizer.name=shampoo --config.optimizer.shampoo.asynchronous=True`); an unknown
field is an error naming the valid ones.

A user error ends as one line with exit status 2, a diverged run with status 3
(`bert_flax.errors`). The logic lives in `bert_flax.train.loop.train_and_evaluate(config, workdir)`,
callable from a notebook.
"""

from absl import app, flags
from ml_collections import config_flags

from bert_flax import errors
from bert_flax.train import loop, overrides

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "Checkpoints, metrics, TensorBoard logs and plots.")
config_flags.DEFINE_config_file("config", None, "Config file (e.g. configs/tiny.py).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    loop.exit_if_preempted(loop.train_and_evaluate(FLAGS.config, FLAGS.workdir))


if __name__ == "__main__":
    errors.run(main, flags_parser=overrides.flags_parser("config"))
