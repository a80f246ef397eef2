"""`python -m bert_flax.compile`: the old name of `python -m bert_flax.aot`, for one release."""

import runpy
import sys

if __name__ == "__main__":
    print("bert_flax.compile is now bert_flax.aot; running that.", file=sys.stderr)
    runpy.run_module("bert_flax.aot", run_name="__main__", alter_sys=True)
