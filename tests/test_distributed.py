"""Two real ranks on 127.0.0.1 (`mlx.launch --backend ring -n 2 --hosts 127.0.0.1`) against one process, on tiny random
models saved as mlx-lm model directories, split as `veloxquant` splits them under `mlx.launch` (notebook 14): a Llama
(4 query heads, 2 KV heads: one per rank) tensor parallel through mlx-lm's `sharded_load`, and a Gemma 3 (6 layers:
three per rank) by layers through `pipeline_gemma3`.

- every configuration of `distributed.check_configs` (every registered method, `kv_fraction`, 4-bit storage,
  SqueezeAttention's key-dispersion signal, chunked compression; prompts prefilled in chunks of 64): the teacher-forced
  logits within 1e-3 of one process's, the same argmax and greedy tokens, the ranks' KV bytes summing to one
  process's; and without the reduction (tensor) or the gather (pipeline) the key-dispersion run is measurably off;
- `veloxquant generate` / `compare` under the launch print once (rank 0) the one-process tokens and schedule, with every
  rank's KV bytes;
- `veloxquant serve` on two ranks answers an HTTP request with the one-process tokens (Llama h2o, Gemma 3 squeeze);
- (model marker) the embedded Gemma 3 270M on two ranks gives the one-process text and schedule.

Run: `pytest -q -s tests/test_distributed.py` (about 4 minutes on 2 CPU cores, 70 s of it the real model). Skipped only
where MLX has no distributed backend or no `mlx.launch`."""
import veloxquant_mlx  # noqa: F401  (loads OpenBLAS before mlx on Linux)
import io, json, os, re, shutil, signal, socket, subprocess, sys, threading, time, urllib.request
from pathlib import Path
import numpy as np
import pytest
import mlx.core as mx
from veloxquant_mlx.eval.sharding import tiny_model_dir, verify_sharding

LAUNCH = shutil.which("mlx.launch") or str(Path(sys.executable).parent / "mlx.launch")

def _unavailable():
    untested = "two ranks are not run (sharding, the CLI and serve under mlx.launch untested)"
    if not mx.distributed.is_available():
        return f"needs an MLX build with a distributed backend (mx.distributed): {untested}"
    if not Path(LAUNCH).exists(): return f"needs mlx.launch beside this Python (it comes with mlx): {untested}"
    return None

pytestmark = pytest.mark.skipif(_unavailable() is not None, reason=str(_unavailable()))

def free_ports(n:int=4)->int:
    """A port p with p .. p+n-1 free on 127.0.0.1 now (the ring backend listens on one port per rank). Another process
    may take one before the ranks bind them: `BIND_FAILED` then matches the launch's stderr, and the launch is retried."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + n > 65535: continue
        try:
            socks = []
            for q in range(p, p + n):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", q))
            return p
        except OSError: continue
        finally:
            for t in socks: t.close()
    raise RuntimeError("no block of free ports")

LAUNCH_TRIES = 4     # launches whose ring ports were taken before the ranks bound them are retried on fresh ports
BIND_FAILED = re.compile(r"Couldn't bind socket|Address already in use")   # the ring backend's message (errno 98)

def launch_cmd(*args)->list:
    "`mlx.launch` of `python ARGS` on two ranks of 127.0.0.1 (ring backend, its own ports)."
    return [LAUNCH, "--backend", "ring", "-n", "2", "--hosts", "127.0.0.1", "--starting-port", str(free_ports()),
            "--", sys.executable, *args]

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                    os.environ.get("PYTHONPATH", "")])}

def run_two_ranks(*args, timeout:int=900)->subprocess.CompletedProcess:
    "Run `python ARGS` on two ranks; the launch and its ranks are killed (process group) if it overruns `timeout`."
    for attempt in range(LAUNCH_TRIES):
        proc = subprocess.Popen(launch_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                                start_new_session=True)
        try: out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"two ranks did not finish in {timeout} s:\n{err[-3000:]}")
        if not BIND_FAILED.search(err): break
    else: pytest.fail(f"the ranks could not bind their ring ports on {LAUNCH_TRIES} tries:\n{err[-3000:]}")
    assert proc.returncode == 0, f"launch failed ({proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("dist") / "tiny-llama", "llama", seed=1, head_dim=32)

@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    "6 layers (2 global), a window of 64: SqueezeAttention's schedule depends on every layer's signal."
    return tiny_model_dir(tmp_path_factory.mktemp("dist") / "tiny-gemma3", "gemma3", seed=1, head_dim=32, n_layers=6,
                          sliding_window=64)

UNREDUCED = (                               # the same run without the reduction (tensor) or the gather (pipeline)
    "model, _ = d.load_sharded(sys.argv[1])\n"
    "if d._STATE['mode'] == 'tensor': d.use_group(None)\n"
    "else: d._gather_signals = lambda *a: None\n"
    "name = 'squeeze@key_dispersion'\n"
    "plain = s.sharding_checks(model, {name: s.check_configs()[name]})\n"
    "if d.rank() == 0: json.dump(plain, open(sys.argv[3], 'w'))\n")

@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_every_method_matches_one_process(arch, model_dir, gemma_dir, tmp_path):
    "Llama: tensor parallel (one KV head per rank); Gemma 3: pipeline (three layers per rank, `pipeline_gemma3`)."
    path = model_dir if arch == "llama" else gemma_dir
    script = tmp_path / "ranks.py"
    script.write_text("import sys, json\nimport veloxquant_mlx.distributed as d, veloxquant_mlx.eval.sharding as s\n"
                      "res = s.verify_sharding(sys.argv[1], sys.argv[2])\n" + UNREDUCED)
    two, plain = tmp_path / "two.json", tmp_path / "plain.json"
    run_two_ranks(str(script), str(path), str(two), str(plain))
    got = json.loads(two.read_text())
    one = verify_sharding(path)
    mode = "tensor" if arch == "llama" else "pipeline"
    assert got.pop("_meta") == {"ranks": 2, "mode": mode} and one.pop("_meta")["ranks"] == 1
    assert set(got) == set(one)
    worst = {}
    for name, ref in one.items():
        g = got[name]
        worst[name] = float(np.abs(np.array(g["logits"]) - np.array(ref["logits"])).max())
        assert worst[name] < 1e-3, name
        assert g["forced_argmax"] == ref["forced_argmax"], name
        assert g["greedy"] == ref["greedy"], name
        assert len(g["kv_bytes_by_rank"]) == 2 and sum(g["kv_bytes_by_rank"]) == ref["kv_bytes_by_rank"][0], name
        assert min(g["kv_bytes_by_rank"]) > 0, name                       # both ranks hold part of the cache
        if mode == "tensor": assert g["kv_bytes_by_rank"][0] == g["kv_bytes_by_rank"][1], name   # one KV head each
    line = ", ".join(f"{k} {v:.1e}" for k, v in worst.items())
    name, what = "squeeze@key_dispersion", "reduction" if mode == "tensor" else "gather"
    unreduced = json.loads(plain.read_text())
    off = float(np.abs(np.array(unreduced[name]["logits"]) - np.array(one[name]["logits"])).max())
    assert off > 1e-2, f"without the {what} the key-dispersion schedule should differ; max |d logits| {off}"
    line += f"; {name} without the {what}: {off:.3f}"
    print(f"\n{arch} ({mode}), 2 ranks vs 1 process, max |d logits| per configuration: {line}")

CLI = "import sys; from veloxquant_mlx.cli import main; sys.exit(main())"
PROMPT = "Eviction keeps a budget of tokens per layer; the ranks each keep their heads' share. " * 3

@pytest.mark.parametrize("arch,args", [
    ("llama", ["generate", "--method", "snapkv", "--kv-fraction", "0.25"]),
    ("llama", ["compare", "--methods", "h2o,squeeze", "--budget", "48", "--signal", "key_dispersion"]),
    ("gemma3", ["compare", "--methods", "squeeze,pyramidkv", "--budget", "24", "--signal", "key_dispersion"])],
    ids=["generate-tensor", "compare-tensor", "compare-pipeline"])
def test_cli_under_mlx_launch(model_dir, gemma_dir, arch, args):
    from veloxquant_mlx.cli import main
    path = model_dir if arch == "llama" else gemma_dir
    args = [*args, "--model", str(path), "--max-tokens", "12", "--prefill-step", "64", "--json", PROMPT]
    r = run_two_ranks("-c", CLI, *args, timeout=600)
    lines = [l for l in r.stdout.splitlines() if l.startswith(("{", "["))]
    assert len(lines) == 1, r.stdout[-2000:]                           # rank 0 prints, rank 1 does not
    buf = io.StringIO()
    assert main(args, out=buf) == 0
    two, one = json.loads(lines[0]), json.loads(buf.getvalue())
    two, one = (two, one) if args[0] == "compare" else ([two], [one])
    for t, o in zip(two, one):
        assert (t["text"], t["generated_tokens"], t["label"]) == (o["text"], o["generated_tokens"], o["label"])
        assert t["kv_bytes_all_ranks"] == o["kv_bytes"] and len(t["kv_bytes_by_rank"]) == 2
        assert t["full_kv_bytes_all_ranks"] == o["full_kv_bytes"]
        assert t["squeeze_budgets"] == o["squeeze_budgets"]             # the reduced key-dispersion schedule
        print(f"\n{args[0]} on 2 ranks, {t['label']}: {t['generated_tokens']} tokens as one process; KV bytes by "
              f"rank {t['kv_bytes_by_rank']} (one process {o['kv_bytes']}); resolved budgets {t['squeeze_budgets']}")

@pytest.mark.parametrize("arch,method", [("llama", "h2o"), ("gemma3", "squeeze")],
                         ids=["tensor-h2o", "pipeline-squeeze"])
def test_serve_on_two_ranks_over_http(model_dir, gemma_dir, arch, method):
    from mlx_lm import load
    from veloxquant_mlx.batch import greedy_alone
    from veloxquant_mlx.builder import KVCacheBuilder
    from veloxquant_mlx.cli import method_config
    from test_serve import complete
    path = model_dir if arch == "llama" else gemma_dir
    for attempt in range(LAUNCH_TRIES):          # the HTTP port is the server's own (--port 0); the ring ports may be taken
        cmd = launch_cmd("-c", CLI, "serve", "--model", str(path), "--method", method, "--budget", "24", "--port", "0",
                         "--", "--log-level", "WARNING")
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV,
                                start_new_session=True)
        try:
            lines, url, t0 = [], None, time.time()
            while url is None:
                line = proc.stderr.readline()
                ended = not line and proc.poll() is not None
                if ended and BIND_FAILED.search("".join(lines)) and attempt + 1 < LAUNCH_TRIES:
                    break                                                   # the ring ports were taken: a fresh launch
                if ended or time.time() - t0 > 300:
                    raise AssertionError("two-rank server did not start:\n" + "".join(lines[-30:]))
                lines.append(line)
                m = re.search(r" on (http://\S+)", line)
                if m: url = m.group(1)
            if url is None: continue
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            served = complete(url, PROMPT, 10)
            break
        finally:
            try: os.killpg(proc.pid, signal.SIGKILL)                        # mlx-lm's distributed server has no stop
            except ProcessLookupError: pass                                 # the launch had ended (ports taken)
            proc.wait(timeout=60)
    model, tok = load(str(path))
    alone = greedy_alone(model, tok.encode(PROMPT), KVCacheBuilder.for_model(model, method_config(method, 24)), 10)
    assert served == alone
    print(f"\nserve ({arch}, {method}) on 2 ranks answered {len(served)} tokens, the one-process tokens: {served}")

@pytest.mark.model
@pytest.mark.slow
def test_default_model_on_two_ranks():
    "The embedded Gemma 3 270M (no --model) split by layers over two ranks: the one-process tokens and schedule."
    from veloxquant_mlx.cli import main
    from veloxquant_mlx.models import prose_text
    args = ["generate", "--method", "squeeze", "--budget", "64", "--max-tokens", "8", "--json", prose_text(1200)]
    r = run_two_ranks("-c", CLI, *args, timeout=900)
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    assert len(lines) == 1, r.stdout[-2000:]
    buf = io.StringIO()
    assert main(args, out=buf) == 0
    two, one = json.loads(lines[0]), json.loads(buf.getvalue())
    assert (two["text"], two["squeeze_budgets"]) == (one["text"], one["squeeze_budgets"])
    assert two["kv_bytes_all_ranks"] == one["kv_bytes"] and min(two["kv_bytes_by_rank"]) > 0
    print(f"\nGemma 3 270M on 2 ranks (pipeline): {two['text']!r} as one process; KV bytes by rank "
          f"{two['kv_bytes_by_rank']} (one process {one['kv_bytes']})")
