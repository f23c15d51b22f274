"""The experiment harness: quality grids (pass key, perplexity), speed and batched-throughput benchmarks.

Exported from the notebooks `nbs/11a_eval_*` .. `nbs/13a_eval_*` (one module each); the results pages are
`nbs/11_quality.ipynb`, `nbs/12_speed.ipynb` and `nbs/13_batch_speed.ipynb`. The library's core modules import
nothing from here. This file is written by hand (nbdev does not make a subpackage's `__init__.py`)."""
