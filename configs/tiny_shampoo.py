r"""The CPU demo (configs/tiny.py) with Shampoo: inverse roots on the host, asynchronously.

  python -m bert_flax.train --config=configs/tiny_shampoo.py --workdir=workdir/tiny_shampoo \
      --config.data.data_dir=workdir/sotu_128

It reaches the race's target eval MLM loss in 0.58x the steps of AdamW and LAMB
(`benchmarks/studies/optimizer_race.py`, docs/results.md). Every `preconditioning_compute_steps`
steps the
host computes new inverse 4th roots of the statistics while the device keeps stepping with the
previous ones (`asynchronous`); the Adam graft sets each block's step size, so the learning rate is
AdamW's. `shampoo/staleness` (steps since the roots in use were computed from the statistics),
`shampoo/root_failures` and the root job seconds appear in the progress line, TensorBoard and
metrics.jsonl.
"""

import ml_collections

from configs import tiny


def get_config() -> ml_collections.ConfigDict:
    config = tiny.get_config()
    config.optimizer.name = "shampoo"
    # The optimizer's defaults are the optimizer race's winners on this model (docs/optim.md:
    # Adam graft, Nesterov momentum, preconditioning from step 1, blocks of 128, roots every 10).
    config.optimizer.shampoo.update(asynchronous=True, weight_decay=0.01)
    return config
