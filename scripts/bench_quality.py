#!/usr/bin/env python
"""Quality grid of veloxquant_mlx's caches on Gemma 3 270M (pass key + perplexity):
`python scripts/bench_quality.py [--quick] [--out nbs/results/quality.json] [--plots nbs/images]`.

A thin wrapper around `veloxquant_mlx.eval.quality_cli.main` (see nbs/11k_eval_quality_cli.ipynb)."""
from veloxquant_mlx.blas import preload_openblas
preload_openblas()  # before anything imports mlx.core
from veloxquant_mlx.eval.quality_cli import main

if __name__ == "__main__":
    main()
