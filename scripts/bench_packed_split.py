#!/usr/bin/env python
"""A batch of the default with its packed products cut over two streams or not (or, with --stack, its products per
query head or stacked), alternating in one process:
`python scripts/bench_packed_split.py [--models "smollm2=16,48;gemma3_270m=32"] [--out nbs/results/packed_split_batch.json]`.

A thin wrapper around `veloxquant_mlx.eval.batch_bench.split_main` (see nbs/13a_eval_batch_bench.ipynb)."""
from veloxquant_mlx.blas import preload_openblas
preload_openblas()  # before anything imports mlx.core
from veloxquant_mlx.eval.batch_bench import split_main

if __name__ == "__main__":
    split_main()
