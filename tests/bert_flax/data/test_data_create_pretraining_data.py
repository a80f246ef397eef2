"""create_pretraining_data's options are one set: the fields of `PretrainingDataOptions`, the
command line's flags (name, default, help, type) and, for the fields marked so, summary.json's
"options"."""

from __future__ import annotations

import dataclasses
import math

import pytest
from absl import flags

from bert_flax.data import create_pretraining_data as cpd

FIELDS = {f.name: f for f in dataclasses.fields(cpd.PretrainingDataOptions)}
# summary.json's "options", in order, as data directories hold them (read by
# `contract.PreparedData` and `demo.check_options`).
RECORDED = ["max_seq_length", "dupe_factor", "short_seq_prob", "masked_lm_prob",
            "max_predictions_per_seq", "whole_word_mask", "seed", "document_mode",
            "validation_fraction", "documents_per_bucket", "train_vocab_size"]  # fmt: skip


@pytest.fixture()
def flag_values() -> flags.FlagValues:
    values = flags.FlagValues()
    cpd.define_flags(values)
    return values


def test_the_flags_are_the_fields_with_their_defaults_and_help(flag_values):
    assert set(flag_values) == set(FIELDS)
    for name, field in FIELDS.items():
        flag = flag_values[name]
        required = field.default is dataclasses.MISSING
        default = None if required else field.default
        help = field.metadata["help"]
        if "choices" in field.metadata:  # absl's enum flag puts them before the help
            help = f"<{'|'.join(field.metadata['choices'])}>: {help}"
        assert (flag.default, flag.help) == (default, help), name


def test_a_command_line_parses_to_the_options_it_spells(flag_values):
    flag_values(["prog", "--output_dir=/tmp/out", "--max_seq_length=64", "--masked_lm_prob=0.2",
                 "--nolowercase", "--max_predictions_per_seq=9", "--document_mode=blank_line",
                 "--beam_options=--direct_num_workers=2 --x=y"])  # fmt: skip
    assert cpd.from_flags(flag_values) == cpd.PretrainingDataOptions(
        output_dir="/tmp/out",
        max_seq_length=64,
        masked_lm_prob=0.2,
        lowercase=False,
        max_predictions_per_seq=9,
        document_mode="blank_line",
        beam_options="--direct_num_workers=2 --x=y",
    )
    flag_values.unparse_flags()
    with pytest.raises(flags.IllegalFlagValueError, match="--output_dir must have a value"):
        flag_values(["prog"])  # the one field without a default is a required flag


def test_the_summary_records_the_marked_options_as_run(summary, speeches_dir):
    """The data conftest's run: the speeches at max_seq_length 128, dupe_factor 1, 1 worker."""
    run = {"max_seq_length": 128, "dupe_factor": 1, "num_workers": 1}
    marked = [name for name, field in FIELDS.items() if field.metadata.get("summary")]
    assert list(summary["options"]) == marked == RECORDED
    expected = {name: run.get(name, FIELDS[name].default) for name in marked}
    expected["max_predictions_per_seq"] = math.ceil(0.15 * 128)  # None resolved
    assert summary["options"] == expected
    assert (summary["input"], summary["runner"]) == (speeches_dir, "local")
    assert summary["vocab"]["lowercase"] is True
