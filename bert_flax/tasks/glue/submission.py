"""The GLUE server's submission files: `index<TAB>prediction`, one line per test example, the
prediction as the task's TSVs write labels (0/1, `entailment`, ...) or STS-B's float score.

    write_submission("workdir/RTE.tsv", GLUE["rte"], ids, logits)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bert_flax.tasks.classification import metrics
from bert_flax.tasks.glue.table import Spec

HEADER = "index\tprediction"


def prediction_strings(spec: Spec, logits: np.ndarray) -> list[str]:
    """Each example's prediction as the submission writes it."""
    predicted = metrics.predictions(logits)
    if spec.tsv_labels is None:
        return [f"{value:.6g}" for value in predicted.tolist()]
    return [spec.tsv_labels[k] for k in predicted.tolist()]


def write_submission(path: str, spec: Spec, ids: Sequence[int], logits: np.ndarray) -> int:
    """Writes the submission file of `spec`'s test examples `ids`; returns its line count."""
    lines = [HEADER, *(f"{i}\t{p}" for i, p in zip(ids, prediction_strings(spec, logits)))]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return len(lines) - 1
