"""Training studies: each trains (and evaluates) runs of minutes to hours, side by side, and
reuses a finished run of the same config, data and code. Run one on an otherwise idle machine."""
