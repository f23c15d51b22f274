#!/usr/bin/env python
"""Issue 21 repro: the 2,000-token pass-key prompt on a fresh `veloxquant serve` (Gemma 3 270M), alone and after one
short completion (env SHORT; default "Count: 1, 2, 3,"): `python scripts/serve_isolation_repro.py [serve options]`
(default `--method squeeze --budget 256`). Each line: the answer, finish reason, usage, seconds."""
import json, os, re, signal, subprocess, sys, time, urllib.request, threading
PY = sys.executable
method = sys.argv[1:] or ["--method", "squeeze", "--budget", "256"]
prompt = subprocess.run([PY, "-c", "import sys; from veloxquant_mlx.cli import main; sys.exit(main())", "passkey",
                         "--tokens", "2000"], capture_output=True, text=True, timeout=600).stdout
def start():
    p = subprocess.Popen([PY, "-c", "import sys; from veloxquant_mlx.cli import main; sys.exit(main())", "serve",
                          "--port", "0", *method, "--", "--log-level", "WARNING"], stderr=subprocess.PIPE, text=True)
    while True:
        line = p.stderr.readline()
        if not line: raise SystemExit("server died")
        m = re.search(r" on (http://\S+)", line)
        if m:
            threading.Thread(target=lambda: [sys.stderr.write("  [server] " + l) for l in p.stderr], daemon=True).start()
            return p, m.group(1)
def post(url, prompt, n):
    body = json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0.0}).encode()
    with urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", body,
                                {"Content-Type": "application/json"}), timeout=1200) as r: out = json.load(r)
    return out["choices"][0]["text"], out["choices"][0]["finish_reason"], out["usage"]
for first in (False, True):
    p, url = start()
    t0 = time.time()
    try:
        if first: print("short:", post(url, os.environ.get("SHORT", "Count: 1, 2, 3,"), 8), flush=True)
        print(f"{'after a short request' if first else 'alone'}:", post(url, prompt, 12), f"{time.time()-t0:.0f}s", flush=True)
    finally:
        p.send_signal(signal.SIGINT); p.wait(300)
