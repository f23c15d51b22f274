#!/usr/bin/env python
"""The project's CPU kernel for packed products against MLX's `quantized_matmul` and the float products, interleaved:
`python scripts/bench_native.py [--quick] [--out nbs/results/native_products.json]`.

A thin wrapper around `veloxquant_mlx.native.bench_main` (see nbs/03a4_native.ipynb)."""
from veloxquant_mlx.blas import preload_openblas
preload_openblas()  # before anything imports mlx.core
from veloxquant_mlx.native import bench_main

if __name__ == "__main__": bench_main()
