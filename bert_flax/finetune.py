"""`python -m bert_flax.finetune`: the old name of `python -m bert_flax.train`, which runs every
task by `config.task` (and `--predict`), for one release."""

import runpy
import sys

if __name__ == "__main__":
    print("bert_flax.finetune is now bert_flax.train; running that.", file=sys.stderr)
    runpy.run_module("bert_flax.train", run_name="__main__", alter_sys=True)
