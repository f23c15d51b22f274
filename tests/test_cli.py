"Tests of the `veloxquant` command line: errors in-process and as a subprocess, the happy path on tiny models, one real-model run."
import io, json, os, subprocess, sys
import pytest
from veloxquant_mlx.cli import main, METHODS, passkey_prompt, ByteTokenizer

def run_cli(*args, stdin=None, timeout=600):
    "Run the CLI as a separate process, as a user would."
    return subprocess.run([sys.executable, "-c", "import sys; from veloxquant_mlx.cli import main; sys.exit(main())", *args],
                          input=stdin, capture_output=True, text=True, timeout=timeout)

def one_error_line(r):
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("veloxquant: error: ")
    return lines[0]

@pytest.mark.parametrize("args, stdin, expect", [
    (["generate", "--method", "streaming", "hi", "--model", "tiny:llama"], None, "invalid choice"),
    (["compare", "--methods", "h2o,streaming", "hi", "--model", "tiny:llama"], None, "unknown method 'streaming'"),
    (["generate", "--method", "h2o", "--budget", "4", "hi", "--model", "tiny:llama"], None, "sink floor"),
    (["generate", "--method", "squeeze", "--budget", "8", "--n-sink", "8", "hi", "--model", "tiny:llama"], None, "n_sink + 1 = 9"),
    (["generate", "--model", "/no/such/model/dir", "hi"], None, "no such mlx-lm model directory"),
    (["generate", "--model", "tiny:llama", "   "], None, "prompt is empty"),
    (["generate", "--model", "tiny:llama", "-"], "", "prompt is empty"),
    (["generate", "--model", "tiny:llama", "x" * 5000], None, "longer than the model's context of 4096"),
    (["generate", "--model", "tiny:llama", "hi", "--file", "prompt.txt"], None, "conflicting prompt sources"),
    (["generate", "--model", "tiny:llama", "--file", "/no/such/prompt.txt"], None, "--file"),
    (["generate", "--model", "tiny:llama", "--chat", "hi"], None, "chat template"),
])
def test_bad_input_one_line_subprocess(args, stdin, expect):
    assert expect in one_error_line(run_cli(*args, stdin=stdin))

def test_bad_input_in_process(capsys):
    assert main(["generate", "--method", "pyramidkv", "--beta", "0.5", "hi", "--model", "tiny:llama"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("veloxquant: error: ") and "beta" in err

def check_report(res):
    "Every full layer of ours holds exactly tokens_kept x per-token bytes; totals add up."
    for l in res["layers"]:
        assert l["per_token_bytes"] > 0
        if l["exact"] is not None: assert l["exact"] and l["nbytes"] == l["tokens_kept"] * l["per_token_bytes"]
    assert res["kv_bytes"] == sum(l["nbytes"] for l in res["layers"])
    assert res["full_kv_bytes"] == sum(l["full_nbytes"] for l in res["layers"])
    assert res["ratio"] == pytest.approx(res["kv_bytes"] / res["full_kv_bytes"])

@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("method", ["h2o", "pyramidkv", "squeeze"])
def test_generate_json_tiny(arch, method):
    buf = io.StringIO()
    assert main(["generate", "--model", f"tiny:{arch}", "--method", method, "--budget", "8", "--max-tokens", "5",
                 "--json", "hello world " * 10], out=buf) == 0
    res = json.loads(buf.getvalue())
    assert set(res) >= {"text", "method", "budget", "layers", "kv_bytes", "full_kv_bytes", "ratio", "prefill_tps", "decode_tps", "peak_memory"}
    assert res["method"] == method and res["budget"] == 8 and res["generated_tokens"] == 5
    assert all(l["exact"] for l in res["layers"])            # 120-token prompt, budget 8: every layer full
    assert sum(l["budget"] for l in res["layers"]) == 8 * len(res["layers"]) or arch == "gemma3"
    assert res["kv_bytes"] == res["kv_bytes_held"] == sum(l["tokens_kept"] * l["per_token_bytes"] for l in res["layers"])
    check_report(res)
    assert res["ratio"] < 0.2

def test_gemma3_full_baseline_counts_windows():
    buf = io.StringIO()
    main(["generate", "--model", "tiny:gemma3", "--method", "h2o", "--budget", "8", "--max-tokens", "3", "--json", "a" * 60], out=buf)
    res = json.loads(buf.getvalue())
    for l in res["layers"]:
        tokens = l["offset"] if l["window"] is None else min(l["offset"], l["window"])
        assert l["full_nbytes"] == tokens * l["per_token_bytes"]
    assert {l["window"] for l in res["layers"]} == {None, 16}

def test_generate_streams_text_then_report_subprocess():
    r = run_cli("generate", "--model", "tiny:gemma3", "--method", "squeeze", "--budget", "8", "--max-tokens", "4", stdin="hello " * 30)
    assert r.returncode == 0, r.stderr
    assert "KV bytes kept:" in r.stdout and "= exact" in r.stdout and "decode" in r.stdout and "peak memory" in r.stdout
    assert "min(offset, window)" in r.stdout

def test_compare_side_by_side():
    buf = io.StringIO()
    assert main(["compare", "--model", "tiny:llama", "--budget", "16", "--max-tokens", "4", "y" * 200], out=buf) == 0
    rows = buf.getvalue().splitlines()
    assert [l.split()[0] for l in rows[1:1 + len(METHODS)]] == list(METHODS)
    buf = io.StringIO()
    main(["compare", "--model", "tiny:llama", "--methods", "full,squeeze", "--budget", "16", "--max-tokens", "4", "--json", "y" * 200], out=buf)
    full, sq = json.loads(buf.getvalue())
    assert full["method"] == "full" and full["budget"] is None and sq["kv_bytes"] < full["kv_bytes"]
    assert full["text"] != "" and full["full_kv_bytes"] == sq["full_kv_bytes"]

def test_file_and_stdin_prompts(tmp_path):
    f = tmp_path / "p.txt"; f.write_text("from a file " * 5)
    a, b = io.StringIO(), io.StringIO()
    assert main(["generate", "--model", "tiny:llama", "--method", "h2o", "--budget", "8", "--max-tokens", "3", "--json", "--file", str(f)], out=a) == 0
    assert main(["generate", "--model", "tiny:llama", "--method", "h2o", "--budget", "8", "--max-tokens", "3", "--json", "-"],
                out=b, stdin=io.StringIO("from a file " * 5)) == 0
    assert json.loads(a.getvalue())["text"] == json.loads(b.getvalue())["text"]

def test_passkey_prompt_bytes():
    tok = ByteTokenizer()
    p = passkey_prompt(1500, 31415, 0.25, tok)
    assert abs(len(tok.encode(p)) - 1500) <= 2 and p.count("31415") == 2
    assert 0.1 < p.index("31415") / len(p) < 0.4 and p.endswith("The pass key is")

@pytest.mark.model
def test_real_model_squeeze_passkey(tmp_path):
    "Gemma 3 270M, ~2k-token pass-key prompt, squeeze at budget 128: the KV bytes are the kept tokens x per-token size."
    from veloxquant_mlx.cli import load_cli_model
    _, tok = load_cli_model(None)
    prompt = tmp_path / "passkey.txt"
    prompt.write_text(passkey_prompt(2000, 52817, 0.5, tok))
    r = run_cli("generate", "--method", "squeeze", "--budget", "128", "--max-tokens", "12", "--json", "--file", str(prompt), timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert 1950 <= res["prompt_tokens"] <= 2050
    assert len(res["layers"]) == 18
    assert all(l["exact"] for l in res["layers"])
    assert res["kv_bytes"] == sum(l["tokens_kept"] * l["per_token_bytes"] for l in res["layers"])
    assert all(l["per_token_bytes"] == 2 * 1 * 256 * 4 for l in res["layers"])   # 1 KV head x head_dim 256, float32
    assert sum(l["budget"] for l in res["layers"]) == 128 * 18
    check_report(res)
    assert res["ratio"] < 0.3 and res["decode_tps"] > 0 and res["prefill_tps"] > 0
