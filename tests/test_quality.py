"Harness checks for the quality grid (structure and the shared prefill's exactness; no score thresholds)."
import json, subprocess, sys
from pathlib import Path
import pytest
from veloxquant_mlx.blas import preload_openblas
preload_openblas()
from veloxquant_mlx.builder import KVCacheConfig
from veloxquant_mlx.eval.prompts import passkey_set, ppl_sequences
from veloxquant_mlx.eval.measure import lcs, first_digits, score_answer
from veloxquant_mlx.eval.batching import check_shared_prefill, check_batched, prefilled, score_continuation, batched_score
from veloxquant_mlx.eval.grid import FULL, GRID, QUICK, GridSettings, grid_configs, run_grid
from veloxquant_mlx.eval.results import merge_results, combine_runs
from veloxquant_mlx.eval.grid_tables import format_table, markdown_table, gap_table, paired_nll
from veloxquant_mlx.eval.plots import plot_results
from veloxquant_mlx.cli import load_cli_model
from veloxquant_mlx.methods import METHODS

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(budgets=[40, 80], n_passkey=2, lengths=[300, 400], depths=[0.5], ppl_samples=1, ppl_context=256, ppl_tokens=24,
            ppl_chunk=8, max_tokens=4, time_budget_s=None)

def check_structure(res, budgets, methods):
    rows = res["rows"]
    for task in ("passkey", "perplexity"):
        tr = [r for r in rows if r["task"] == task]
        assert len(tr) == 1 + len(budgets) * len(methods)
        full = [r for r in tr if r["name"] == "full"]
        assert len(full) == 1 and full[0]["kv_fraction"] == 1.0
        for r in tr:
            assert {"model", "task", "method", "name", "params", "budget", "kv_fraction", "samples", "seed"} <= set(r)
            assert r["samples"] >= 1
            if r["name"] != "full": assert r["budget"] in budgets and 0 < r["kv_fraction"] < 1
    for task in ("passkey", "perplexity"):          # every budget is its own row: more budget, more bytes held
        by = {}
        for r in rows:
            if r["task"] == task and r["name"] != "full": by.setdefault(r["name"], []).append((r["budget"], r["kv_fraction"]))
        for name, pts in by.items():
            fr = [f for _, f in sorted(pts)]
            assert all(a < b for a, b in zip(fr, fr[1:])), (task, name, sorted(pts))
    for r in rows:
        if r["task"] == "passkey": assert 0 <= r["accuracy"] <= 1 and 0 <= r["partial"] <= 1
        else: assert r["ppl"] > 0 and r["ppl_ratio"] > 0
    json.dumps(res)
    assert isinstance(format_table(res), str)

def test_scoring():
    assert lcs("12345", "12345") == 5 and lcs("13579", "12345") == 3 and lcs("", "12345") == 0
    assert first_digits(" 12345.\n") == "12345" and first_digits(" the key") == ""
    s = score_answer(" 12346. Remember", "12345")
    assert s["exact"] == 0.0 and s["partial"] == 0.8
    assert score_answer(" 12345", "12345")["exact"] == 1.0
    assert score_answer(" 123456789", "12345")["partial"] == 1.0   # only the first len(key) digits count for partial credit

def test_configs_cover_the_grid():
    "Every registered method has a row (without a line of its own in the harness), and the rows' labels are unique."
    cfgs = grid_configs(128)
    labels = [c.label for c in cfgs]
    assert len(set(labels)) == len(labels) == len(GRID)
    assert {m for m in METHODS if m != "full"} <= set(labels)
    for c in cfgs:
        assert c.budget == 128 and KVCacheConfig.from_label(c.label, 128) == c

EVICTING = [c for c in grid_configs(40) if not c.entry.baseline]

@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_shared_prefill_matches_own_prefill(arch):
    "Every eviction method gives the same tokens (and first-step log-probs) from the shared prefill as from its own generate_step."
    model, tok = load_cli_model("tiny:" + arch)
    ids = passkey_set(tok, 1, lengths=[300], depths=[0.5])[0]["ids"]
    res = check_shared_prefill(model, tok, ids, [FULL] + EVICTING, max_tokens=4)
    for name, r in res.items():
        assert r["same"], (name, r)
        assert r["first_logprob_maxdiff"] < 1e-3, (name, r)

@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_batched_decoding_matches_sequential(arch):
    "Batched decoding (one forward for every method) gives each method the answer its own generate_step gives."
    model, tok = load_cli_model("tiny:" + arch)
    ids = passkey_set(tok, 1, lengths=[300], depths=[0.3])[0]["ids"]
    res = check_batched(model, tok, ids, grid_configs(40), max_tokens=5)
    assert len(res) == 1 + len(GRID)
    for name, r in res.items(): assert r["same"], (name, r)

def test_batched_perplexity_matches_sequential():
    model, tok = load_cli_model("tiny:gemma3")
    ids = ppl_sequences(tok, 1, 200, 20)[0]
    configs = grid_configs(40)
    seq = [score_continuation(model, c, ids, 200, 8) for c in prefilled(model, ids[:200], configs)]
    bat = batched_score(model, prefilled(model, ids[:200], configs), ids, 200, 8)
    for name, (a, n), (b, k) in zip(["full"] + [c.label for c in configs], seq, bat):
        assert n == k == 20 and abs(a - b) <= 1e-4 * abs(a) + 1e-3, (name, a, b)

def test_run_grid_tiny():
    model, tok = load_cli_model("tiny:gemma3")
    res = run_grid(model, tok, GridSettings("tiny:gemma3", **TINY), log=lambda *a: None)
    check_structure(res, TINY["budgets"], GRID)
    assert res["rows"][-1]["samples"] == 2 and len(res["keys"]) == 2 and len(res["prompts"]) == 2

def test_run_grid_sequential_and_verify_agree():
    model, tok = load_cli_model("tiny:llama")
    kw = {**TINY, "n_passkey": 1, "budgets": [40]}
    a = run_grid(model, tok, GridSettings("tiny:llama", batched=True, verify=True, **kw), log=lambda *x: None)
    b = run_grid(model, tok, GridSettings("tiny:llama", batched=False, **kw), log=lambda *x: None)
    assert all(r["same"] for r in a["verification"]["results"].values())
    for ra, rb in zip(a["rows"], b["rows"]):
        assert ra["name"] == rb["name"]
        if ra["task"] == "passkey": assert ra["answers"] == rb["answers"]
        else: assert abs(ra["ppl"] - rb["ppl"]) <= 1e-4 * rb["ppl"]

def test_plot_results(tmp_path):
    model, tok = load_cli_model("tiny:llama")
    res = run_grid(model, tok, GridSettings("tiny:llama", **{**TINY, "n_passkey": 1}), log=lambda *a: None)
    paths = plot_results(res, str(tmp_path))
    assert sorted(Path(p).name for p in paths) == ["quality_passkey_accuracy.png", "quality_passkey_partial.png", "quality_perplexity.png"]

def test_script_quick_mode(tmp_path):
    "The --quick mode through the script (tiny model, harness only)."
    out = tmp_path / "q.json"
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_quality.py"), "--quick", "--model", "tiny:gemma3", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["settings"]["quick"] is True
    check_structure(res, list(QUICK.budgets), GRID)

def test_extend_and_merge():
    "A pass-key-only run continuing an earlier one pools into the same rows (sample-weighted)."
    model, tok = load_cli_model("tiny:llama")
    kw = {**TINY, "budgets": [40]}
    a = run_grid(model, tok, GridSettings("tiny:llama", **{**kw, "n_passkey": 1}), log=lambda *x: None)
    b = run_grid(model, tok, GridSettings("tiny:llama", **{**kw, "n_passkey": 1, "ppl_samples": 0, "passkey_offset": 1}), log=lambda *x: None)
    assert not any(r["task"] == "perplexity" for r in b["rows"])
    both = run_grid(model, tok, GridSettings("tiny:llama", **{**kw, "n_passkey": 2}), log=lambda *x: None)
    m = merge_results(a, b)
    assert m["keys"] == both["keys"] and len(m["runs"]) == 2
    check_structure(m, [40], GRID)
    for x, y in zip(sorted(m["rows"], key=lambda r: (r["task"], r["name"])), sorted(both["rows"], key=lambda r: (r["task"], r["name"]))):
        assert x["samples"] == y["samples"]
        if x["task"] == "passkey": assert x["answers"] == y["answers"] and abs(x["partial"] - y["partial"]) < 1e-9
    with pytest.raises(ValueError): merge_results(b, a)

def test_perplexity_only_run_combines_with_passkey_run():
    model, tok = load_cli_model("tiny:llama")
    kw = {**TINY, "budgets": [40], "n_passkey": 1}
    a = run_grid(model, tok, GridSettings("tiny:llama", **kw), log=lambda *x: None)
    b = run_grid(model, tok, GridSettings("tiny:llama", **{**kw, "n_passkey": 0, "ppl_samples": 2}), log=lambda *x: None)
    assert {r["task"] for r in b["rows"]} == {"perplexity"} and all(len(r["nll_per_text"]) == 2 for r in b["rows"])
    c = combine_runs(a, b)
    check_structure(c, [40], GRID)
    assert next(r for r in c["rows"] if r["task"] == "perplexity")["samples"] == 2 and c["settings"]["ppl_samples"] == 2
    assert isinstance(markdown_table(c), str) and len(gap_table(c)) == len(GRID)
    d = paired_nll(c, "h2o", "h2o[score=key_proxy]")
    assert len(d) == 1 and d[0]["texts"] == 2 and 0 <= d[0]["a_lower"] <= 2
    assert paired_nll(c, "h2o", "h2o")[0]["mean_diff"] == 0
