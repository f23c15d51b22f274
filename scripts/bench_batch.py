#!/usr/bin/env python
"""Batched decoding throughput, full cache vs eviction at a KV memory cap, on Gemma 3 270M:
`python scripts/bench_batch.py [--quick] [--out nbs/results/batch_speed.json] [--images nbs/images]`.

A thin wrapper around `veloxquant_mlx.eval.batch_bench.main` (see nbs/13a_eval_batch_bench.ipynb)."""
from veloxquant_mlx.blas import preload_openblas
preload_openblas()  # before anything imports mlx.core
from veloxquant_mlx.eval.batch_bench import main

if __name__ == "__main__":
    main()
