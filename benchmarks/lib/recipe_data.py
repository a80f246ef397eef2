"""The CPU recipe's data as the training studies prepare it: the bundled corpus, once, in
`--workdir/sotu_cpu`, at `--dupe_factor` maskings (the recipe's by default; data prepared with
other options is refused, not reused)."""

from __future__ import annotations

import argparse
import os

from bert_flax import demo
from configs import cpu_pretrain


def add_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dupe_factor",
        type=int,
        default=cpu_pretrain.PREPARE["dupe_factor"],
        help="Maskings of the corpus in the prepared data (the recipe's by default).",
    )


def prepare(args: argparse.Namespace) -> tuple[str, dict]:
    """The prepared data's directory and its summary."""
    data_dir = os.path.join(args.workdir, "sotu_cpu")
    return data_dir, demo.prepare_data(data_dir, dupe_factor=args.dupe_factor)
