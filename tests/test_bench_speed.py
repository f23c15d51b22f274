"Harness checks for the speed benchmarks (structure only, no speed thresholds)."
import json, subprocess, sys
from dataclasses import asdict
from pathlib import Path
import pytest
from veloxquant_mlx.blas import preload_openblas
preload_openblas()
from veloxquant_mlx.eval import bench_run as bench  # the run, its tables and command line (and the kinds)
from veloxquant_mlx.methods import METHODS, Method, register
from veloxquant_mlx.policies import Recency

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(decode_models=["tiny"], decode_budget=16, decode_steps=2, decode_rounds=2, context_model="tiny",
            context_lengths=[32, 64], context_budget=16, prefill_step=32, prefill_repeats=2, context_decode_steps=2,
            context_decode_rounds=2, reference_lengths=[32], coordinator_length=64, coordinator_repeats=1,
            profile_reps=2)

def check_structure(run, s):
    "Every part of `run` is there, with the shape the settings `s` ask for (no speed is checked)."
    assert isinstance(run, bench.SpeedRun) and run.elapsed_s > 0
    assert run.machine["cpu_count"] >= 1 and "blas" in run.machine
    kinds = s["decode_kinds"] or list(bench.decode_kinds())
    assert run.settings["decode_kinds"] == kinds
    assert all(m in kinds for m in METHODS if m != "full")               # every registered method, no list of ours
    for name in s["decode_models"]:
        d = run.decode[name]
        assert list(d.kinds) == kinds
        for k, r in d.kinds.items():
            assert len(d.samples_s[k]) == s["decode_rounds"] and all(len(x) == s["decode_steps"] for x in d.samples_s[k])
            assert r.tok_s > 0 and r.kv_bytes > 0 and len(r.tokens_kept) == run.profile[name].n_layers
            assert (r.ratio_vs_plain is None) == (k == "plain")
        p = run.profile[name]
        assert min(p.score_update, p.argmin, p.scatter_x4, p.attention) > 0 and p.n_layers >= 1
    rows = run.contexts.rows
    assert [r.length for r in rows] == s["context_lengths"]
    for r in rows:
        assert list(r.kinds) == s["context_kinds"]
        assert len(r.kinds["plain"].prefill_s) == s["prefill_repeats"]
        h = r.kinds[bench.CONTEXT_KINDS[1]]
        assert h.prefill_ratio_vs_plain > 0 and h.decode_speedup_vs_plain > 0 and h.peak_bytes > 0
    assert rows[-1].kinds[bench.CONTEXT_KINDS[1]].kv_bytes < rows[-1].kinds["plain"].kv_bytes   # eviction holds the budget
    assert [r.length for r in run.evict_paths] == s["reference_lengths"]
    assert all(r.reference_over_batched > 0 for r in run.evict_paths)
    co = run.coordinator
    assert co.length == s["coordinator_length"] and co.label == s["coordinator_label"] and co.prefill_med_s > 0
    assert 0 <= co.total_share < 1 and len(co.budgets) >= 1
    assert isinstance(bench.format_table(run), str)

def test_run_all_in_process_tiny():
    run = bench.run_all(quick=True, overrides=TINY, log=lambda *a: None)
    check_structure(run, {**bench.QUICK, **TINY})
    assert bench.SpeedRun.from_dict(json.loads(json.dumps(asdict(run)))) == run   # JSON round trip

def test_a_new_method_is_benchmarked_without_code():
    "A method registered in the registry appears in the decode comparison by itself."
    register(Method("bench-demo", "Demo", "https://example.org", "the sinks and the newest tokens", (),
                    lambda p: Recency()))
    try:
        run = bench.run_all(quick=True, overrides=TINY, log=lambda *a: None, parts=("decode",))
        assert run.decode["tiny"].kinds["bench-demo"].tokens_kept == [16, 16]
        assert "bench-demo" in bench.format_table(run)
    finally: del METHODS["bench-demo"]

def test_committed_results_load():
    "The committed JSON (written before these records) still loads and formats."
    run = bench.SpeedRun.load(ROOT / "nbs" / "results" / "speed.json")
    assert "4. squeeze prefill 8192 tokens" in bench.format_table(run) and run.elapsed_s > 0
    scores = bench.SpeedRun.load(ROOT / "nbs" / "results" / "speed_scores.json")
    assert scores.contexts is None and "h2o+attn" in bench.format_decode(scores)
    assert bench.format_table(scores).count("\n") == 1 + 1 + 3 * 4               # machine, header lines, 3 x 4 kinds

def test_plot_results_writes_pngs(tmp_path):
    run = bench.run_all(quick=True, overrides=TINY, log=lambda *a: None)
    bench.plot_results(run, str(tmp_path))
    assert sorted(p.name for p in tmp_path.glob("speed_*.png")) == ["speed_contexts.png", "speed_decode.png",
                                                                    "speed_prefill.png"]

def test_script_quick_mode(tmp_path):
    "The real --quick mode through the script, as a user runs it (harness only)."
    out = tmp_path / "speed.json"
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_speed.py"), "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "1. decode" in p.stdout and "4. squeeze prefill" in p.stdout
    run = bench.SpeedRun.load(out)
    assert run.settings["quick"] is True and not (tmp_path / "speed.json.partial").exists()
    check_structure(run, bench.QUICK)

def test_script_one_part(tmp_path):
    "`--parts` runs only the parts named."
    out = tmp_path / "decode.json"
    sets = [f"--set={k}={json.dumps(v)}" for k, v in TINY.items()]
    run = bench.main(["--quick", "--parts", "decode", "--out", str(out)] + sets)
    assert run.contexts is None and run.coordinator is None and list(run.decode) == ["tiny"]
    assert bench.SpeedRun.load(out) == run
