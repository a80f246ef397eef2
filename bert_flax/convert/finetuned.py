"""A fine-tuned model (its parameters and head config, `runs.parameters.load_finetuned`) as the
Hugging Face class of its task, with the tokenizer files `transformers.pipeline` loads:

    export_finetuned(params, config, head, "/ckpt/hf_sentiment")
    # pipeline("text-classification", model="/ckpt/hf_sentiment")

classification and multi_label -> `BertForSequenceClassification` (labels, problem type), squad ->
`BertForQuestionAnswering`, token_classification -> `BertForTokenClassification`.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from bert_flax.convert.hugging_face import hf_class_of, label_fields, save_hf_checkpoint
from bert_flax.convert.tables import Params
from bert_flax.data import tokenization
from bert_flax.model.config import BertConfig

# A task (a head config's "task") -> the Hugging Face class of its model.
HF_CLASS_OF_TASK = {
    "classification": "BertForSequenceClassification",
    "multi_label": "BertForSequenceClassification",
    "squad": "BertForQuestionAnswering",
    "token_classification": "BertForTokenClassification",
}
TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP = "tokenizer_config.json", "special_tokens_map.json"
_SPECIAL = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]"}
_SPECIAL |= {"cls_token": "[CLS]", "mask_token": "[MASK]"}


def task_of(head: dict[str, Any]) -> str | None:
    """The fine-tuning task of a head config (classifiers from before "task" was recorded: by
    their `num_labels`); None for a pre-training run's."""
    return head.get("task") or ("classification" if "num_labels" in head else None)


def hf_fields(head: dict[str, Any]) -> dict[str, Any]:
    """The `config.json` fields of the head's task (labels, problem type); ValueError naming
    what no `transformers` class expresses."""
    task = task_of(head)
    if task not in HF_CLASS_OF_TASK:
        raise ValueError(
            f"A {task or 'pre-training'} run's best/ has no transformers class (exported: "
            f"{', '.join(HF_CLASS_OF_TASK)}); export a pre-training run's checkpoint with "
            "--from_workdir on a workdir without best/."
        )
    if task == "squad":
        return {}
    if task == "token_classification":
        return label_fields(head["label_names"])
    if head.get("pooling", "cls") != "cls":
        raise ValueError(
            f"This classifier reads pooling={head['pooling']!r} states; transformers' "
            "BertForSequenceClassification reads the [CLS] state: fine-tune with "
            "--config.classifier.pooling=cls to export it."
        )
    if head["label_names"] is None:
        problem = "regression"
    elif head.get("multi_label"):
        problem = "multi_label_classification"
    else:
        problem = "single_label_classification"
    names = head["label_names"] or [f"LABEL_{i}" for i in range(head["num_labels"])]
    return label_fields(names) | {"problem_type": problem}


def export_finetuned(params: Params, config: BertConfig, head: dict[str, Any], out: str) -> None:
    """Writes the model (`hf_fields`, checked before anything is written) and its tokenizer
    files (`save_tokenizer`) to `out`."""
    fields, expected = hf_fields(head), HF_CLASS_OF_TASK[task_of(head)]
    if hf_class_of(params) != expected:
        raise ValueError(f"The parameters are a {hf_class_of(params)}'s, not a {expected}'s.")
    save_hf_checkpoint(params, config, out, **fields)
    save_tokenizer(out, head.get("vocab_file"), head.get("lowercase", True), config)


def save_tokenizer(out: str, vocab_file: str | None, lowercase: bool, config: BertConfig) -> None:
    """`vocab.txt` (the run's vocabulary), `tokenizer_config.json` (BertTokenizer with the run's
    case setting) and `special_tokens_map.json` in `out`."""
    os.makedirs(out, exist_ok=True)
    shutil.copyfile(vocab_file or tokenization.default_vocab_path(), os.path.join(out, "vocab.txt"))
    tokenizer = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": lowercase,
        "model_max_length": config.max_position_embeddings,
        **_SPECIAL,
    }
    for name, fields in ((TOKENIZER_CONFIG, tokenizer), (SPECIAL_TOKENS_MAP, _SPECIAL)):
        with open(os.path.join(out, name), "w") as f:
            json.dump(fields, f, indent=2)
