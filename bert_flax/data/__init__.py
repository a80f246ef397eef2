"""Pre-training data: corpora (TFDS builders), WordPiece tokenization, BERT examples, TFRecord
shards with their length histogram and packing strategies, and the packed tf.data pipeline.

    python -m bert_flax.data.create_pretraining_data --input=sotu --output_dir=/tmp/sotu128
    python -m bert_flax.data.verify_packing --data_dir=/tmp/sotu128
    bert_flax.data.pipeline.packed_dataset("/tmp/sotu128", batch_size=32)

See docs/data.md.
"""
