"""The online input: prepared data (`bert_flax.data`) to packed batches, on the host.

    ds = datasets.packed_dataset("/tmp/sotu128", batch_size=32)   # the packed-batch contract
    ds = datasets.padded_dataset("/tmp/sotu128", batch_size=32)   # one sequence a row (D = 1)
    stats = datasets.pack_stats("/tmp/sotu128")                    # rows and efficiency, unread

See docs/data.md.
"""
