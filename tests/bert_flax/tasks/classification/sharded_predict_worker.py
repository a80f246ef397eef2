"""Run by test_classification_finetune.py on 8 simulated CPU devices (`python -m
tests.bert_flax.tasks.classification.sharded_predict_worker`): `predict` on a data-parallel and on
a data x fsdp x model mesh gives the 1-device logits; prints OK."""

import jax
import numpy as np
from jax.sharding import AxisType

from bert_flax import sharding
from bert_flax.data import tokenization
from bert_flax.input_pipeline.contract import CLASSIFICATION_INPUTS
from bert_flax.input_pipeline.rows import batches
from bert_flax.tasks.classification import data as classification
from bert_flax.tasks.classification.model import BertForSequenceClassification
from bert_flax.tasks.classification.predict import predict
from bert_flax.tasks.inference import sharded_apply
from tests.bert_flax.tasks.classification.test_classification_finetune import (
    CONFIG,
    MAX_LEN,
    TEXTS,
)


def main() -> None:
    n = 3 * len(TEXTS)
    labels, ids = np.zeros(n, np.int32), np.arange(n, dtype=np.int32)
    split = classification.LabelledSplit(texts=TEXTS * 3, texts_b=None, labels=labels, ids=ids)
    encoded = classification.encode_split(tokenization.load_vocab(), split, MAX_LEN)
    model = BertForSequenceClassification(CONFIG, num_labels=3)
    batch = next(batches(encoded, batch_size=2, max_seq_length=MAX_LEN))
    inputs = {k: batch[k] for k in CLASSIFICATION_INPUTS}
    params = model.init(jax.random.key(0), inputs, deterministic=True)["params"]
    one = jax.make_mesh(
        (1, 1, 1), sharding.MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=jax.devices()[:1]
    )
    reference = predict(CONFIG, params, 3, encoded, rows=4, mesh=one)
    for shape in ((8, 1, 1), (2, 2, 2)):
        mesh = sharding.create_mesh(shape)
        _, shardings = sharded_apply(model, mesh, inputs, lambda out: out.logits)
        if shape == (2, 2, 2):  # really split: kernels over model, embed dims over fsdp
            specs = [str(s.spec) for s in jax.tree.leaves(shardings)]
            assert any("model" in s for s in specs) and any("fsdp" in s for s in specs), specs
        got = predict(CONFIG, params, 3, encoded, rows=4, mesh=mesh)
        np.testing.assert_allclose(got, reference, atol=2e-5)
    print("OK")


if __name__ == "__main__":
    main()
