"""`veloxquant serve` (notebook 07a) as a separate process on a free localhost port, queried with a real HTTP client
(urllib): concurrent requests of different lengths, more than the server decodes at once (so requests join a running
batch), each answered with the token ids the same prompt gives alone with the same method and budget. A tiny Gemma 3
for CI; the real Gemma 3 270M under the `model` marker."""
import veloxquant_mlx  # noqa: F401  (loads OpenBLAS before mlx on Linux)
import json, os, re, signal, subprocess, sys, threading, time, urllib.request
from concurrent.futures import ThreadPoolExecutor
import pytest
from veloxquant_mlx.batch import greedy_alone
from veloxquant_mlx.builder import KVCacheBuilder, tiny_model
from veloxquant_mlx.cli import method_config
from veloxquant_mlx.serve import tiny_tokenizer

def start_server(*args, timeout=300, **popen):
    "Start `veloxquant serve ARGS --port 0` in a child process (`popen`: more Popen options); (process, url) once it listens."
    cmd = [sys.executable, "-c", "import sys; from veloxquant_mlx.cli import main; sys.exit(main())", "serve",
           "--port", "0", *args]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, "VELOXQUANT_DEBUG": "1"}, **popen)
    lines, url, t0 = [], None, time.time()
    while url is None:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None or time.time() - t0 > timeout:
            proc.kill()
            raise RuntimeError("server did not start:\n" + "".join(lines[-30:]))
        lines.append(line)
        m = re.search(r" on (http://\S+)", line)
        if m: url = m.group(1)
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()   # keep draining its log
    return proc, url

def stop_server(proc, sig=signal.SIGINT, patience=600):
    "Send `sig` and wait for the process to end (generously: a loaded machine may take long); None if it never did."
    proc.send_signal(sig)
    try: return proc.wait(timeout=patience)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None

def complete(url, prompt, max_tokens):
    "POST /v1/completions (greedy) and return the generated token ids (sent back as logprobs)."
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "logprobs": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        assert r.status == 200
        out = json.load(r)
    return [t["id"] for t in out["choices"][0]["logprobs"]["content"]]

PROMPTS = ["The pass key is 52817. Remember it. " * 3, "Hello there", "Caches, batches and servers: " * 4,
           "A short one", "Eviction keeps a budget of tokens per layer. " * 2]

def test_serve_tiny_model_over_http():
    proc, url = start_server("--model", "tiny:gemma3", "--method", "squeeze", "--budget", "12", "--",
                             "--decode-concurrency", "2", "--prompt-concurrency", "2", "--log-level", "WARNING")
    try:
        with ThreadPoolExecutor(len(PROMPTS)) as ex: served = list(ex.map(lambda p: complete(url, p, 10), PROMPTS))
    finally: code = stop_server(proc)
    assert code == 0, f"after SIGINT the server ended with {code} (None: still running after 10 minutes)"
    model, tok, cfg = tiny_model("gemma3"), tiny_tokenizer(), method_config("squeeze", 12)
    assert served == [greedy_alone(model, tok.encode(p), KVCacheBuilder.for_model(model, cfg), 10) for p in PROMPTS]

def _ignore_sigint():
    "In the child before exec: SIGINT ignored, as a job started with `cmd &`, nohup or some CI runners inherit it."
    signal.signal(signal.SIGINT, signal.SIG_IGN)

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_serve_stops_on_a_signal_with_sigint_inherited_ignored(sig):
    "Python sets no SIGINT handler when SIGINT arrives ignored: the server sets its own, for SIGINT and SIGTERM."
    proc, url = start_server("--model", "tiny:gemma3", "--method", "h2o", "--budget", "12", "--",
                             "--log-level", "WARNING", preexec_fn=_ignore_sigint)
    code = stop_server(proc, sig, patience=120)    # generous: the exit is asserted, never how fast it came
    assert code == 0, (f"after {sig.name} the server (started with SIGINT ignored) ended with {code} "
                       "(None: still running after 120 s, then killed)")

def test_serve_rejects_a_baseline_it_cannot_batch():
    from veloxquant_mlx.cli import main
    assert main(["serve", "--model", "tiny:llama", "--method", "mlx-rotating"]) == 2

@pytest.mark.model
def test_serve_real_model_over_http():
    from veloxquant_mlx.models import load_default_model
    proc, url = start_server("--method", "squeeze", "--budget", "32", "--", "--decode-concurrency", "2",
                             "--log-level", "WARNING")
    prompts = PROMPTS[:2]
    try:
        with ThreadPoolExecutor(len(prompts)) as ex: served = list(ex.map(lambda p: complete(url, p, 4), prompts))
    finally: stop_server(proc)
    model, tok = load_default_model(progress=False)
    cfg = method_config("squeeze", 32)
    alone = [greedy_alone(model, tok.encode(p), KVCacheBuilder.for_model(model, cfg), 4) for p in prompts]
    assert served == [a[:len(s)] for a, s in zip(alone, served)] and all(len(s) >= 1 for s in served)
