#!/usr/bin/env python
"""One process vs two ranks of 127.0.0.1 (`mlx.launch --backend ring`), on a random Llama-shaped model directory:
KV bytes per rank, prefill and decode tokens/s. `python scripts/bench_distributed.py [--quick] [--out PATH]`.

A thin wrapper around `veloxquant_mlx.eval.sharding.bench_main` (see nbs/14_distributed.ipynb)."""
from veloxquant_mlx.blas import preload_openblas
preload_openblas()  # before anything imports mlx.core
from veloxquant_mlx.eval.sharding import bench_main

if __name__ == "__main__":
    bench_main()
