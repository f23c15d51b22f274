#!/usr/bin/env python
"""Where a batch step of the default spends its time, piece by piece:
`python scripts/profile_batch_step.py [--model smollm2] [--length 2048] [--rows 16] [--out nbs/results/batch_step_profile.json]`.

A thin wrapper around `veloxquant_mlx.eval.batch_bench.profile_main` (see nbs/13a_eval_batch_bench.ipynb)."""
from veloxquant_mlx.blas import preload_openblas
preload_openblas()  # before anything imports mlx.core
from veloxquant_mlx.eval.batch_bench import profile_main

if __name__ == "__main__":
    profile_main()
