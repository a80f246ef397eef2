"""Packed question answering: a packed row's start/end logits and loss equal the same windows
run one by one, and each sequence's answer is sought only in its own context."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_flax.data.tokenization import load_vocab
from bert_flax.input_pipeline.contract import RowShape
from bert_flax.input_pipeline.rows import build_rows
from bert_flax.model.config import BertConfig
from bert_flax.tasks.squad import model, reading, rows

CONTEXTS = [
    "The Normans gave their name to Normandy, a region in France.",
    "Rollo agreed to swear fealty to King Charles III of West Francia in 911.",
    "Westminster Abbey saw William crowned king of England on Christmas Day.",
]
ANSWERS = ["France", "Charles III", "Christmas Day"]


@pytest.fixture(scope="module")
def windows():
    vocab = load_vocab()
    found = []
    for i, (context, answer) in enumerate(zip(CONTEXTS, ANSWERS)):
        example = reading.Example(
            str(i), "What is it?", context, (reading.Answer(answer, context.index(answer)),)
        )
        found += reading.to_windows(example, vocab, max_seq_length=40)
    return found


def run(qa_model, params, batch):
    out = qa_model.apply(params, batch, deterministic=True)
    loss, metrics = model.qa_loss(out, batch)
    return out, loss, metrics


def test_a_packed_row_equals_its_windows_one_by_one(windows):
    config = BertConfig.preset("tiny", vocab_size=30522, dtype="float32")
    qa_model = model.BertForQuestionAnswering(config)
    table = rows.WindowTable(windows)
    packed = build_rows(table, [[0, 1, 2]], RowShape(128, 3))
    params = qa_model.init(jax.random.key(0), packed, deterministic=True)
    out, loss, metrics = run(qa_model, params, packed)
    assert metrics["qa_loss"][1] == 3
    singles = []
    for i, window in enumerate(windows):
        one = build_rows(table, [[i]], RowShape(128, 1))
        single_out, single_loss, _ = run(qa_model, params, one)
        first, length = int(packed["cls_positions"][0, i]), len(window.input_ids)
        for name in ("start_logits", "end_logits"):
            np.testing.assert_allclose(
                getattr(out, name)[0, first : first + length],
                getattr(single_out, name)[0, :length],
                atol=2e-5,
                err_msg=f"{name} of window {i}",
            )
        singles.append(float(single_loss))
    np.testing.assert_allclose(float(loss), np.mean(singles), rtol=1e-5)


def test_each_sequence_seeks_its_answer_only_in_its_own_context(windows):
    table = rows.WindowTable(windows)
    batch = {k: jnp.asarray(v) for k, v in build_rows(table, [[0, 1, 2]], RowShape(128, 3)).items()}
    logits = model.slot_logits(jnp.zeros((1, 128)), batch)
    for i, window in enumerate(windows):
        allowed = np.flatnonzero(np.asarray(logits[0, i]) > -1e8)
        first = int(batch["cls_positions"][0, i])
        expected = [first, *(first + np.flatnonzero(window.context_mask))]
        assert allowed.tolist() == expected
        assert batch["start_positions"][0, i] == first + window.start
        assert batch["end_positions"][0, i] == first + window.end
