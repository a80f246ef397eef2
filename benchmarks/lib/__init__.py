"""What the benchmarks share: results files (`records`) and the docs' blocks (`blocks`)."""
