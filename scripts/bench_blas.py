#!/usr/bin/env python
"""CPU matmuls with OpenBLAS loaded before MLX against MLX's own BLAS, and bfloat16 against float32:
`python scripts/bench_blas.py [--quick] [--out nbs/results/blas_speed.json]`.

Each side runs in a fresh interpreter (`veloxquant_mlx.blas.run_child_json`: OpenBLAS is preloaded, or opted out,
before `mlx.core` is imported); each product is timed `reps` times after a warm-up and the median is kept. The shapes
are a decoding step's (one row times Gemma 3 270M's 640 x 2,048 projection) and a 512-token prefill chunk's.
nbs/05a_blas.ipynb ("Measuring it") says what the committed file holds."""
import argparse, json, os
from veloxquant_mlx.blas import run_child_json

SHAPES = {"decode": (1, 640, 2048), "prefill": (512, 640, 2048)}   # (rows, inner, columns)

CHILD = """
import json, statistics, time
from veloxquant_mlx.blas import preload_openblas
s = preload_openblas()
import mlx.core as mx
out = {{"blas": [s.loaded, s.path, s.reason], "ms": {{}}}}
for name, (m, k, n) in {shapes}.items():
    for dt in ("float32", "bfloat16"):
        a, b = (mx.random.normal(sh, key=mx.random.key(i)).astype(getattr(mx, dt)) for i, sh in enumerate([(m, k), (k, n)]))
        mx.eval(a @ b)
        t = []
        for _ in range({reps}):
            t0 = time.perf_counter(); mx.eval(a @ b); t.append(1e3 * (time.perf_counter() - t0))
        out["ms"][name + " " + dt] = statistics.median(t)
print(json.dumps(out))
"""

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 repetitions instead of 30")
    ap.add_argument("--out", default="nbs/results/blas_speed.json")
    a = ap.parse_args()
    reps = 5 if a.quick else 30
    code = CHILD.format(shapes=repr(SHAPES), reps=reps)
    sides = {side: run_child_json(code, openblas, what="matmul timing") for side, openblas in (("openblas", True),
                                                                                               ("mlx_own", False))}
    res = dict(command="python scripts/bench_blas.py" + (" --quick" if a.quick else ""), reps=reps, shapes=SHAPES,
               cpu_count=os.cpu_count(), load_avg=list(os.getloadavg()), sides=sides)
    with open(a.out, "w") as f: json.dump(res, f, indent=1)
    for k, o in sides["openblas"]["ms"].items():
        m = sides["mlx_own"]["ms"][k]
        print(f"{k:18s} OpenBLAS {o:9.3f} ms   MLX's own {m:9.3f} ms   {m / o:6.1f}x")

if __name__ == "__main__":
    main()
