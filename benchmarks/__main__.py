r"""`python -m benchmarks`: the published results and the docs' blocks rendered from them.

    python -m benchmarks --docs       # rewrites every marked block of README.md and docs/
    python -m benchmarks --check      # names the blocks that differ from their files
    python -m benchmarks --publish_run=workdir/cpu_soap --name=cpu_pretrain_soap \
        --command="python -m bert_flax.train --config=configs/cpu_pretrain_soap.py ..."
    python -m benchmarks --publish_run=workdir/demo --name=demo --command="make demo"

`--publish_run` publishes a training run's final metrics (its `final_metrics.json`) or a demo's
summary (`demo_summary.json`) as a results file, as a benchmark's `--json` does its result.
"""

from __future__ import annotations

import argparse

from benchmarks.lib import blocks
from benchmarks.lib.records import publish_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", action="store_true", help="Rewrite the docs' result blocks.")
    parser.add_argument("--check", action="store_true", help="Name the blocks that differ.")
    parser.add_argument("--publish_run", metavar="WORKDIR", help="A run's final metrics.")
    parser.add_argument("--name", help="--publish_run: the results file's name.")
    parser.add_argument("--command", help="--publish_run: the command that trained the run.")
    args = parser.parse_args()
    if args.publish_run:
        if not (args.name and args.command):
            parser.error("--publish_run needs --name and --command")
        print(publish_run(args.publish_run, args.name, args.command))
    if args.docs or args.check:
        changed = blocks.update_docs(write=args.docs)
        for path, name in changed:
            print(f"{path}: block {name} {'rewritten' if args.docs else 'differs from its file'}")
        if args.check and changed:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
