"""The attention back-end registry and dispatcher, and the relative-position bias, against the
per-sequence reference and the configuration checks they make."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_flax.kernels import segment_attention
from bert_flax.model import attention
from bert_flax.model.config import BertConfig
from bert_flax.model.layers import RelativePositionBias, relative_position_bucket


@pytest.mark.parametrize("impl", ["packed_tpu", "packed_gpu"])
def test_the_skipping_backends_take_a_window_and_the_others_refuse_it(impl, qkv_segments):
    out = attention.attention(*qkv_segments, impl=impl, window=16)
    np.testing.assert_allclose(
        out, segment_attention.xla_attention(*qkv_segments, window=16), atol=2e-5
    )
    with pytest.raises(ValueError, match=r"attention_impl='splash' has no sliding window"):
        attention.attention(*qkv_segments, impl="splash", window=16)


def _bucket_reference(offset: int, num_buckets: int, max_distance: int) -> int:
    """T5's relative bucket, one offset at a time, written from its description."""
    half = num_buckets // 2
    exact = half // 2
    first = half if offset > 0 else 0
    n = abs(offset)
    if n < exact:
        return first + n
    log_bucket = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (half - exact))
    return first + min(log_bucket, half - 1)


@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 16), (4, 3)])
def test_relative_position_buckets_match_a_scalar_reference(num_buckets, max_distance):
    offsets = np.arange(-300, 301)
    got = np.asarray(relative_position_bucket(jnp.asarray(offsets), num_buckets, max_distance))
    want = [_bucket_reference(int(o), num_buckets, max_distance) for o in offsets]
    np.testing.assert_array_equal(got, want)
    # Every bucket is used but the second half's first (a positive offset of 0), as in T5.
    assert set(got.tolist()) == set(range(num_buckets)) - {num_buckets // 2}


def test_neighbour_bias_starts_heads_0_and_1_on_the_previous_and_next_token():
    config = BertConfig.preset(
        "tiny", num_heads=4, relative_attention_buckets=8, relative_attention_neighbour_bias=5.0
    )
    module = RelativePositionBias(config)
    bias = np.asarray(module.apply(module.init(jax.random.key(0), 7), 7))[0]
    rows = np.arange(7)
    offset = rows[None, :] - rows[:, None]  # [query, key]
    np.testing.assert_array_equal(bias[0], np.where(offset == -1, 5.0, 0.0))
    np.testing.assert_array_equal(bias[1], np.where(offset == 1, 5.0, 0.0))
    np.testing.assert_array_equal(bias[2:], 0.0)


def test_relative_attention_is_validated():
    BertConfig.preset("tiny", relative_attention_buckets=32)
    for bad in ({"relative_attention_buckets": 7}, {"relative_attention_buckets": 2}):
        with pytest.raises(ValueError, match="even number >= 4"):
            BertConfig.preset("tiny", **bad)
    with pytest.raises(ValueError, match="takes no logit bias"):
        BertConfig.preset(
            "tiny", relative_attention_buckets=32, attention_impl="cudnn", attention_dropout_rate=0
        )
    with pytest.raises(ValueError, match="needs relative_attention_buckets"):
        BertConfig.preset("tiny", relative_attention_neighbour_bias=5.0)
    with pytest.raises(ValueError, match="num_heads >= 2"):
        BertConfig.preset(
            "tiny", num_heads=1, relative_attention_buckets=8, relative_attention_neighbour_bias=5
        )


def test_attention_dropout_bits_are_checked():
    with pytest.raises(ValueError, match="attention_dropout_bits=16 is not one of"):
        BertConfig.preset("tiny", attention_dropout_bits=16)
    with pytest.raises(ValueError, match=r"dropout rate of 0\.001 keeps 256/256"):
        BertConfig.preset("tiny", attention_dropout_bits=8, attention_dropout_rate=0.001)
    with pytest.raises(ValueError, match=r"dropout rate of 0\.999 keeps 0/256"):
        BertConfig.preset("tiny", attention_dropout_bits=8, attention_dropout_rate=0.999)
    assert BertConfig.preset("tiny", attention_dropout_bits=8).attention_dropout_bits == 8


def test_attention_dropout_head_groups_must_divide_the_heads():
    with pytest.raises(ValueError, match="attention_dropout_head_groups=5 must be 0"):
        BertConfig.preset("tiny", attention_dropout_head_groups=5)
    assert BertConfig.preset("tiny", attention_dropout_head_groups=1).attention_dropout_head_groups


def test_fused_backends_reject_attention_dropout():
    for impl in ("cudnn", "splash", "pallas_gpu", "auto"):
        with pytest.raises(ValueError, match="attention_dropout_rate"):
            BertConfig.preset("tiny", attention_impl=impl)
        BertConfig.preset("tiny", attention_impl=impl, attention_dropout_rate=0.0)


@pytest.mark.parametrize("impl", ["packed_tpu", "packed_gpu"])
def test_block_skipping_kernels_take_attention_dropout_but_not_its_variants(impl):
    BertConfig.preset("tiny", attention_impl=impl)
    for variant in ({"attention_dropout_head_groups": 1}, {"attention_dropout_bits": 8}):
        with pytest.raises(ValueError, match="draws its own attention-dropout mask"):
            BertConfig.preset("tiny", attention_impl=impl, **variant)
        BertConfig.preset("tiny", attention_impl=impl, attention_dropout_rate=0, **variant)


@pytest.mark.parametrize(
    ("platform", "length", "expected"),
    [("tpu", 512, "packed_tpu"), ("gpu", 512, "packed_gpu"), ("cpu", 512, "xla"),
     ("tpu", 128, "packed_tpu"), ("gpu", 384, "packed_gpu"), ("tpu", 200, "xla"),
     ("gpu", 64, "xla")],
)  # fmt: skip
def test_auto_is_the_platforms_kernel_where_its_rows_fit(platform, length, expected):
    assert attention.backend_for("auto", platform, length) == expected


@pytest.mark.parametrize(
    ("impl", "platform"), [("splash", "gpu"), ("pallas_gpu", "tpu"), ("packed_gpu", "tpu")]
)
def test_a_kernel_for_the_other_accelerator_is_an_error_naming_the_fix(impl, platform):
    fix = "packed_tpu" if platform == "tpu" else "packed_gpu"
    with pytest.raises(ValueError, match=rf"interpret mode.*'auto' \(here '{fix}'\)"):
        attention.backend_for(impl, platform, 512)
    assert attention.backend_for(impl, platform, 512, interpret=True) == impl  # asked for
    assert attention.backend_for(impl, "cpu", 512) == impl  # the test suite's interpret mode
    assert attention.backend_for("xla", platform, 512) == "xla"


def test_a_kernel_traced_for_the_other_accelerator_fails_unless_interpreted(
    monkeypatch, qkv_segments, per_sequence_attention
):
    """At trace time too (a model built outside `create_train_program`): splash in a program for
    a GPU is refused; with `interpret` it runs, interpreted, and matches the reference."""
    monkeypatch.setattr(attention.sharding, "target_platform", lambda: "gpu")
    with pytest.raises(ValueError, match="attention_interpret=True"):
        attention.attention(*qkv_segments, impl="splash")
    out = attention.attention(*qkv_segments, impl="splash", interpret=True)
    np.testing.assert_allclose(out, per_sequence_attention(*qkv_segments), atol=1e-5)


def test_auto_runs_xla_attention_on_cpu(monkeypatch, qkv_segments, per_sequence_attention):
    calls = []
    xla = attention.BACKENDS["xla"]
    traced = dataclasses.replace(xla, fn=lambda *a, **k: calls.append(k) or xla.fn(*a, **k))
    monkeypatch.setitem(attention.BACKENDS, "xla", traced)
    out = attention.attention(*qkv_segments, impl="auto", interpret=True)
    np.testing.assert_allclose(out, per_sequence_attention(*qkv_segments), atol=1e-5)
    assert len(calls) == 1 and "interpret" not in calls[0]  # XLA takes no interpret flag


def test_attention_interpret_is_for_pallas_kernels():
    with pytest.raises(ValueError, match="attention_interpret=True interprets Pallas kernels"):
        BertConfig.preset("tiny", attention_interpret=True)
    for impl in ("splash", "pallas_gpu", "packed_gpu", "auto"):
        BertConfig.preset(
            "tiny", attention_impl=impl, attention_interpret=True, attention_dropout_rate=0.0
        )


def test_a_backend_added_to_the_registry_is_accepted_and_used(
    monkeypatch, qkv_segments, per_sequence_attention
):
    """Adding a backend touches `attention.BACKENDS` only: the config accepts its name and the
    layer dispatches to it."""
    calls = []

    def traced_xla(*args, **kwargs):
        calls.append(kwargs)
        return segment_attention.xla_attention(*args, **kwargs)

    with pytest.raises(ValueError, match="attention_impl='reference' is not one of"):
        BertConfig.preset("tiny", attention_impl="reference")
    backend = attention.Backend(traced_xla, supports_dropout=False, description="test")
    monkeypatch.setitem(attention.BACKENDS, "reference", backend)
    with pytest.raises(
        ValueError, match=r"use attention_impl in \['xla', 'packed_gpu', 'packed_tpu'\]"
    ):
        BertConfig.preset("tiny", attention_impl="reference")
    BertConfig.preset("tiny", attention_impl="reference", attention_dropout_rate=0.0)
    out = attention.attention(*qkv_segments, impl="reference")
    np.testing.assert_allclose(out, per_sequence_attention(*qkv_segments), atol=1e-5)
    assert len(calls) == 1 and calls[0]["deterministic"]
