"""What a failed checkpoint read or write says about its cause."""

from bert_flax.checkpointing import short_reason


def test_the_cause_survives_tensorstore_s_spec_and_the_elision():
    # As a full disk failed a save in CI: the cause, then a spec of several KB (shortened here).
    spec = (
        '{\\"driver\\":\\"zarr\\",' + '\\"path\\":\\"opt_state.mu/\\",' * 200 + '\\"open\\":true}'
    )
    error = ValueError(
        'RESOURCE_EXHAUSTED: Error opening "zarr" driver: Error writing "opt_state.mu/.zarray": '
        "Failed to write 18771 bytes to file 18: No space left on device [os_error_code='28'] "
        f"[tensorstore_spec='{spec}']\nsecond line"
    )
    reason = short_reason(error)
    assert "No space left on device" in reason and "tensorstore_spec" not in reason
    assert len(reason) <= 305 and reason.startswith("RESOURCE_EXHAUSTED")


def test_a_long_message_keeps_its_head_and_tail():
    reason = short_reason(RuntimeError("head " + "x" * 1000 + " the cause"))
    assert reason.startswith("head ") and reason.endswith(" the cause") and " ... " in reason
