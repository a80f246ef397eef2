"""Every custom kernel, apart from the layers that call them: attention over segments
(`segment_attention`: XLA, cuDNN), the Pallas attention kernels per shard (`pallas_attention`:
splash, Pallas GPU, and the block-skipping `packed_attention_tpu` and `packed_attention_gpu`
over `block_ranges` and `dropout_bits`), and the block-sparse products (`block_sparse_cpu`: C++
through XLA's FFI; `block_sparse_xla`; `block_sparse_gpu` and `block_sparse_tpu`: Pallas; over
`block_sparse_plan`'s index plans)."""
