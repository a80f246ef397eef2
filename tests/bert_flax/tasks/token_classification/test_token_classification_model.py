"""Packed token classification: a packed row's logits and loss equal the same sentences run one
by one; labels sit on each word's first sub-word (or every sub-word); the parameters are laid out
as Hugging Face's `BertForTokenClassification`."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_flax.data.tokenization import encode, load_vocab
from bert_flax.input_pipeline.contract import RowShape
from bert_flax.input_pipeline.rows import build_rows
from bert_flax.model.bert import BertForPreTraining
from bert_flax.model.config import BertConfig
from bert_flax.tasks.token_classification import model, rows
from bert_flax.tasks.token_classification.reading import Sentence
from bert_flax.tasks.token_classification.task import TokenClassificationTask
from configs import conll

SENTENCES = [
    Sentence(("EU", "rejects", "German", "call"), ("B-ORG", "O", "B-MISC", "O"), "a", 1),
    Sentence(("Peter", "Blackburn"), ("B-PER", "I-PER"), "a", 6),
    Sentence(("Unbelievably", "Tokenizable", "words", "."), ("O", "B-MISC", "O", "O"), "a", 9),
]
LABELS = {"O": 0, "B-ORG": 1, "B-MISC": 2, "B-PER": 3, "I-PER": 4}
CONFIG = BertConfig.preset("tiny", vocab_size=30522, dtype="float32")


@pytest.fixture(scope="module")
def vocab():
    return load_vocab()


def run(classifier, params, batch):
    out = classifier.apply(params, batch, deterministic=True)
    return out, *model.token_loss(out, batch)


def test_a_packed_row_equals_its_sentences_one_by_one(vocab):
    classifier = model.BertForTokenClassification(CONFIG, len(LABELS))
    table = rows.SentenceTable.build(SENTENCES, vocab, LABELS, 64)
    packed = build_rows(table, [[0, 1, 2]], RowShape(64, 4))
    params = classifier.init(jax.random.key(0), packed, deterministic=True)
    out, loss, metrics = run(classifier, params, packed)
    assert metrics["token_loss"][1] == sum(len(s.words) for s in SENTENCES)
    sums, counts = 0.0, 0.0
    for i in range(len(SENTENCES)):
        one = build_rows(table, [[i]], RowShape(64, 1))
        single, _, single_metrics = run(classifier, params, one)
        first, length = int(packed["cls_positions"][0, i]), int(table.lengths[i])
        np.testing.assert_allclose(
            out.logits[0, first : first + length], single.logits[0, :length], atol=2e-5
        )
        sums += float(single_metrics["token_loss"][0])
        counts += float(single_metrics["token_loss"][1])
    np.testing.assert_allclose(float(loss), sums / counts, rtol=1e-5)


@pytest.mark.parametrize("all_subwords", [False, True])
def test_a_word_is_labelled_on_its_first_sub_word_or_on_all(vocab, all_subwords):
    table = rows.SentenceTable.build(SENTENCES, vocab, LABELS, 64, all_subwords)
    batch = build_rows(table, [[2]], RowShape(64, 1))
    pieces = [len(p) for p in encode(vocab, list(SENTENCES[2].words))]
    assert pieces[0] > 1 and pieces[1] > 1  # words of several sub-words
    want_labels, want_starts = [-1], [0]  # [CLS]
    for size, label in zip(pieces, SENTENCES[2].labels):
        rest = LABELS[label] if all_subwords else -1
        want_labels += [LABELS[label]] + [rest] * (size - 1)
        want_starts += [1] + [0] * (size - 1)
    want_labels.append(-1)  # [SEP]
    want_starts.append(0)
    length = len(want_labels)
    assert (
        batch["input_ids"][0, 0] == vocab.cls_id
        and batch["input_ids"][0, length - 1] == vocab.sep_id
    )
    assert batch["token_labels"][0, :length].tolist() == want_labels
    assert batch["label_mask"][0, :length].tolist() == [int(x >= 0) for x in want_labels]
    assert batch["word_starts"][0, :length].tolist() == want_starts
    assert not batch["label_mask"][0, length:].any()
    assert batch["sentence_ids"].tolist() == [[2]]


def test_a_long_sentence_keeps_the_words_that_fit_and_is_counted(vocab):
    table = rows.SentenceTable.build(SENTENCES, vocab, LABELS, 5)
    kept = []
    for sentence in SENTENCES:
        sizes = np.cumsum([len(p) for p in encode(vocab, list(sentence.words))])
        kept.append(int(np.sum(sizes <= 5 - 2)))
    assert [len(offsets) for offsets in table.word_offsets] == kept
    assert table.truncated == sum(k < len(s.words) for k, s in zip(kept, SENTENCES)) == 2
    assert table.lengths.max() <= 5


def test_the_parameters_are_laid_out_as_hugging_faces():
    config = conll.get_config()
    config.data.rule_sentences = 40
    task = TokenClassificationTask(config)
    classifier = task.model(CONFIG)
    init = lambda module, batch: nn.unbox(
        jax.eval_shape(lambda: module.init(jax.random.key(0), batch, deterministic=True))["params"]
    )  # shapes only: nothing compiles
    params = init(classifier, task.synthetic_batch(2, 0))
    assert sorted(params) == ["bert", "classifier"]
    assert jax.tree.map(np.shape, params["classifier"]) == {
        "kernel": (CONFIG.hidden_size, 5),
        "bias": (5,),
    }
    batch = {**task.synthetic_batch(1, 0), "masked_lm_positions": np.zeros((1, 4), np.int32)}
    pretraining = init(BertForPreTraining(CONFIG), batch)
    loaded = task.pretrained_params(pretraining, params)
    assert loaded["bert"] is pretraining["bert"] and loaded["classifier"] is params["classifier"]
    assert task.pretrained_params(loaded, params) is loaded  # a token classifier's own
    head = task.head_config()
    assert head["label_names"] == ["O", "B-DATE", "B-NAME", "B-NUM", "I-NAME"]
    assert {k: head[k] for k in ("label_scheme", "entity_mode", "label_all_subwords")} == {
        "label_scheme": "IOB2",
        "entity_mode": "conlleval",
        "label_all_subwords": False,
    }
    assert head["vocab_file"].endswith("vocab.txt")
