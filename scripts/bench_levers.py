"""Levers measured alone (AdaKV's head-wise budgets, MiKV's low-bit tier): `python scripts/bench_levers.py --study S --out F`."""
import veloxquant_mlx  # first: it loads OpenBLAS (Linux) before MLX
from veloxquant_mlx.eval.levers import levers_main

if __name__ == "__main__":
    levers_main()
