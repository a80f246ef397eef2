"""Paths the tests share."""

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
"""The repository root: the working directory of the commands the tests run."""
