"""The batched-throughput benchmark (notebook 13) end to end on a tiny Gemma 3: its command line writes the JSON and
the figure, every batch size is measured for both methods, and the comparison at the cap is reported. No time or
time ratio is asserted."""
import veloxquant_mlx  # noqa: F401  (loads OpenBLAS before mlx on Linux)
import json
from veloxquant_mlx.eval.batch_bench import main, summarize

def test_bench_batch_command_line(tmp_path, capsys):
    out = tmp_path / "b.json"
    res = main(["--quick", "--out", str(out), "--images", str(tmp_path), "--set", 'model="tiny:gemma3"',
                "--set", "lengths=[40]", "--set", "batches=[1,2]", "--set", "budget=12", "--set", "steps=1",
                "--set", "prefill_step=16", "--set", "cap_mib=1"])
    saved = json.loads(out.read_text())
    run = saved["runs"]["40"]
    assert [r["B"] for r in run["full"]] == [1, 2] and [r["B"] for r in run["evict"]] == [1, 2]
    assert run["evict"][0]["kv_bytes_per_row"] < run["full"][0]["kv_bytes_per_row"]
    assert "ratio" in run["at_cap"] and res["label"] == "squeeze[compress=chunk]"   # pinned: the measured configuration
    assert (tmp_path / "batch_speed_quick.png").exists()
    assert "at the 1 MiB cap" in capsys.readouterr().out

def test_summarize_picks_the_largest_batch_within_the_cap():
    mib = 2**20
    run = dict(full=[dict(B=b, kv_bytes_per_row=64 * mib, tok_s=float(b)) for b in (1, 2, 4, 7, 8)],
               evict=[dict(B=b, kv_bytes_per_row=9 * mib, tok_s=2.0 * b) for b in (1, 8, 32)])
    s = summarize(run, 512 * mib)
    assert (s["full"]["B"], s["evict"]["B"], s["full"]["largest_fit"]) == (8, 32, 8)   # 8 x 64 MiB = the cap
    assert abs(s["ratio"] - 64 / 8) < 1e-9
