"""`python -m bert_flax.block_sparse.cpu`: the old name of
`python -m bert_flax.kernels.block_sparse_cpu`, for one release."""

import runpy
import sys

if __name__ == "__main__":
    print("bert_flax.block_sparse.cpu is now bert_flax.kernels.block_sparse_cpu; running that.",
          file=sys.stderr)  # fmt: skip
    runpy.run_module("bert_flax.kernels.block_sparse_cpu", run_name="__main__", alter_sys=True)
