#!/usr/bin/env python
"""The default's decode step and prefill against the full cache, on the embedded models:
`python scripts/bench_default_speed.py [--quick] [--out nbs/results/default_speed.json] [--image nbs/images/default_speed.png]`.

A thin wrapper around `veloxquant_mlx.eval.default_speed.main` (see nbs/12d_eval_default_speed.ipynb)."""
from veloxquant_mlx.blas import preload_openblas
preload_openblas()  # before anything imports mlx.core
from veloxquant_mlx.eval.default_speed import main

if __name__ == "__main__":
    main()
