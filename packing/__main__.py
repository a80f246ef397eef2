"""Pack a sequence-length histogram and report.

  python -m packing HISTOGRAM --max-len 384 --algorithm all --max-depth 3 \
      [--out strategies.json] [--plot report.png] [--json]

HISTOGRAM is a text file (one count per line, line k = sequences of length k, line 0 = 0) or .npy.
Without --json a table like the paper's is printed; with --json one JSON object per algorithm run.
With --algorithm all, --out saves the run with the fewest packs. Bad input ends as one line,
exit status 2 (`bert_flax.errors`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from bert_flax import errors
from packing import api, report
from packing import histogram as histogram_lib

ALL = ("spfhp", "lpfhp", "nnlshp", "lp")


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m packing", description=__doc__.split("\n")[0])
    parser.add_argument("histogram", help="length histogram: .txt (one count per line) or .npy")
    parser.add_argument("--max-len", type=int, required=True, help="tokens per packed row")
    parser.add_argument(
        "--algorithm",
        default="nnlshp",
        choices=(*sorted(api.ALGORITHMS), "all"),
        help="packing algorithm; 'all' runs " + ", ".join(ALL),
    )
    parser.add_argument(
        "--max-depth", type=int, default=3, help="most sequences per row, 0 = unlimited"
    )
    parser.add_argument("--out", help="write the strategy set (JSON) here")
    parser.add_argument("--plot", help="write a PNG report here")
    parser.add_argument("--json", action="store_true", help="one JSON object per run")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.max_depth < 0:
        raise ValueError("--max-depth must be >= 0 (0 = unlimited)")
    for path in (args.out, args.plot):
        if path:
            errors.check_writable_dir(os.path.dirname(os.path.abspath(path)))
    hist = histogram_lib.load_histogram(args.histogram, args.max_len)
    algorithms = ALL if args.algorithm == "all" else (args.algorithm,)
    results = []
    for algorithm in algorithms:
        if algorithm in api.NEEDS_FINITE_DEPTH and args.max_depth == 0 and len(algorithms) > 1:
            print(f"skipping {algorithm}: it needs a finite --max-depth", file=sys.stderr)
            continue
        try:
            strategies = api.pack_histogram(hist, args.max_len, algorithm, args.max_depth)
        except ValueError as e:
            raise ValueError(f"{algorithm}: {e}") from e
        strategies.check(hist)
        results.append(strategies)
        if args.json:
            print(json.dumps(report.summary(strategies)), flush=True)
    if not args.json:
        print(report.format_table(results))
    if args.out and results:
        best = min(results, key=lambda s: s.num_packs)
        best.save(args.out)
        print(f"saved {best.algorithm} strategies to {args.out}", file=sys.stderr)
    if args.plot and results:
        report.plot_report(hist, results, args.plot)
        print(f"saved plot to {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(errors.guard(main)())
