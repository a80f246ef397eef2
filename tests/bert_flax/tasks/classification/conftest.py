"""The bundled Rotten Tomatoes split, read once for the classification tests."""

from __future__ import annotations

import pytest

from bert_flax.tasks.classification import reading


@pytest.fixture(scope="session")
def rotten():
    return reading.rotten_tomatoes()
