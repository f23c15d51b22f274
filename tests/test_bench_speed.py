"Harness checks for the speed benchmarks (structure only, no speed thresholds)."
import json, subprocess, sys
from pathlib import Path
import pytest
from veloxquant_mlx.blas import preload_openblas
preload_openblas()
from veloxquant_mlx import bench

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(decode_models=["tiny"], decode_budget=16, decode_steps=2, decode_rounds=2, context_model="tiny",
            context_lengths=[32, 64], context_budget=16, prefill_step=32, prefill_repeats=2, context_decode_steps=2,
            context_decode_rounds=2, reference_lengths=[32], coordinator_length=64, coordinator_repeats=1, profile_reps=2)

def check_structure(res, s):
    assert {"machine", "settings", "decode", "profile", "contexts", "evict_paths", "coordinator", "elapsed_s"} <= set(res)
    assert res["machine"]["cpu_count"] >= 1 and "blas" in res["machine"]
    for name in s["decode_models"]:
        d = res["decode"][name]
        assert set(d["kinds"]) == {"plain", "h2o", "squeeze"}
        for k, r in d["kinds"].items():
            assert len(d["samples_s"][k]) == s["decode_rounds"] and all(len(x) == s["decode_steps"] for x in d["samples_s"][k])
            assert r["tok_s"] > 0 and r["kv_bytes"] > 0
            if k != "plain": assert r["ratio_vs_plain"] > 0
        assert {"score_update", "argmin", "scatter_x4", "attention"} <= set(res["profile"][name])
    rows = res["contexts"]["rows"]
    assert [r["length"] for r in rows] == s["context_lengths"]
    for r in rows:
        assert len(r["kinds"]["plain"]["prefill_s"]) == s["prefill_repeats"]
        h = r["kinds"]["h2o"]
        assert h["prefill_ratio_vs_plain"] > 0 and h["decode_speedup_vs_plain"] > 0 and h["peak_bytes"] > 0
    # eviction holds at most the budget in every layer
    assert rows[-1]["kinds"]["h2o"]["kv_bytes"] < rows[-1]["kinds"]["plain"]["kv_bytes"]
    assert [r["length"] for r in res["evict_paths"]] == s["reference_lengths"]
    assert all(r["reference_over_batched"] > 0 for r in res["evict_paths"])
    co = res["coordinator"]
    assert co["length"] == s["coordinator_length"] and 0 <= co["total_share"] < 1 and co["prefill_med_s"] > 0
    assert isinstance(bench.format_table(res), str)

def test_run_all_in_process_tiny():
    res = bench.run_all(quick=True, overrides=TINY, log=lambda *a: None)
    check_structure(res, {**bench.QUICK, **TINY})
    json.dumps(res)  # JSON-ready

def test_plot_results_writes_pngs(tmp_path):
    res = bench.run_all(quick=True, overrides=TINY, log=lambda *a: None)
    bench.plot_results(res, str(tmp_path))
    assert sorted(p.name for p in tmp_path.glob("speed_*.png")) == ["speed_contexts.png", "speed_decode.png", "speed_prefill.png"]

def test_script_quick_mode(tmp_path):
    "The real --quick mode through the script, as a user runs it (harness only)."
    out = tmp_path / "speed.json"
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_speed.py"), "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "1. decode" in p.stdout and "4. squeeze prefill" in p.stdout
    res = json.loads(out.read_text())
    assert res["settings"]["quick"] is True
    check_structure(res, bench.QUICK)
