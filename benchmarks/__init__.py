"""Side-by-side measurements, each printing a ratio measured in one run, and the published
results (`benchmarks/results/`) that every figure in the docs is rendered from.

    python -m benchmarks.<name> --json          # a quick measurement (seconds to minutes)
    python -m benchmarks.studies.<name> --json  # a training study (minutes to hours)
    python -m benchmarks --docs                 # the docs' blocks, rendered from the files

`lib/` is their shared library: `records` (a results file: publish, read, the commit it ran
on) and `blocks` (the docs' blocks and their renderers). How to add one: docs/design.md,
"Adding a benchmark".
"""
