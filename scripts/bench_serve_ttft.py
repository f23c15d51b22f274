#!/usr/bin/env python
"""A short request's time to first token on `veloxquant serve`, alone and while a long prompt is read, at each prefill
chunk size and scheduler: `python scripts/bench_serve_ttft.py [--quick] [--runs 2048:mlx,512:mlx,512:fair]
[--model tiny:llama] [--method ...]`.

The long prompt is `veloxquant passkey` at 8,000 tokens (4,000 with --quick); the short one is a 234-token
completion ("Count: 1, 2, ..., 60,"; the default configuration refuses prompts too short for its share of the
cache, `serve.shortest_prompt`).
Prints one JSON line per run; `--out PATH` also writes the runs with their settings as one JSON file, which
nbs/07a_serve.ipynb ("A short request behind a long prompt") lays out with `ttft_table` from
`nbs/results/serve_ttft*.json`."""
from veloxquant_mlx.blas import preload_openblas
preload_openblas()  # before anything imports mlx.core
import argparse, json, os, sys, time
from pathlib import Path
from veloxquant_mlx.cli import load_cli_model, method_config, passkey_prompt
from veloxquant_mlx.models import DEFAULT_MODEL_NAME
from mlx_lm.generate import BatchGenerator
import veloxquant_mlx.serve as serve
from veloxquant_mlx.serve import EvictingServer, first_token_delays, tiny_tokenizer
FAIR = serve.FairBatchGenerator

SHORT = "Count: " + ", ".join(str(i) for i in range(1, 61)) + ","

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a 4,000-token long prompt instead of 8,000")
    ap.add_argument("--runs", default="2048:mlx,512:mlx,512:fair", help="prefill chunk size:scheduler pairs to compare "
                    "(mlx: mlx-lm's BatchGenerator; fair: the server's FairBatchGenerator)")
    ap.add_argument("--model", default=None, help="as for veloxquant serve (default: the embedded Gemma 3 270M)")
    ap.add_argument("--method", default="auto", help="the served method (default: the recommended configuration)")
    ap.add_argument("--out", default=None, help="also write the runs and their settings as JSON here "
                    "(nbs/results/serve_ttft_8k.json, or ..._4k.json with --quick)")
    a = ap.parse_args()
    model, tok = load_cli_model(a.model)
    if a.model and a.model.startswith("tiny:"): tok = tiny_tokenizer()
    n = 4000 if a.quick else 8000
    long = passkey_prompt(n, 52817, 0.5, tok)
    load, runs = list(os.getloadavg()), []
    for run in a.runs.split(","):
        step, scheduler = int(run.split(":")[0]), run.split(":")[1]
        serve.FairBatchGenerator = FAIR if scheduler == "fair" else BatchGenerator   # what the server builds
        srv = EvictingServer(model, tok, method_config(a.method), ["--port", "0", "--log-level", "CRITICAL",
                                                                   "--prefill-step-size", str(step)]).start()
        try: d = first_token_delays(srv.url, SHORT, long)
        finally: srv.stop()
        runs.append(dict(prefill_step=step, scheduler=scheduler, **d))
        print(json.dumps(dict(long_prompt_tokens=n, method=a.method, **runs[-1])), flush=True)
    if a.out:
        doc = dict(command="python scripts/bench_serve_ttft.py " + " ".join(sys.argv[1:]),
                   model=a.model or DEFAULT_MODEL_NAME, method=a.method, long_prompt_tokens=n,
                   short_prompt_tokens=len(tok.encode(SHORT)), machine=dict(cpu_count=os.cpu_count(), load_avg=load),
                   runs=runs)
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
