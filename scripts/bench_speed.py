#!/usr/bin/env python
"""Speed and memory benchmarks of veloxquant_mlx's caches.

`python scripts/bench_speed.py [--quick] [--parts decode,contexts,evict_paths,coordinator] [--set KEY=JSON]
[--out nbs/results/speed.json] [--images nbs/images]`

A thin wrapper around `veloxquant_mlx.eval.bench_run.main` (see nbs/12c_eval_bench_run.ipynb)."""
from veloxquant_mlx.blas import preload_openblas
preload_openblas()  # before anything imports mlx.core
from veloxquant_mlx.eval.bench_run import main

if __name__ == "__main__":
    main()
