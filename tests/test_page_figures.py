"""The quality page (nbs/11_quality.ipynb) and its result JSON cannot disagree.

Its results sections say their figures in computed cells (`#| exec_doc`: the docs build runs them on the files of the
checkout); these tests check that the outputs saved in the notebook are what those cells compute now, that the prose
turns with its JSON (a result file changed under it changes the figures and the verdicts it prints), and that no
markdown cell of the results sections types a result figure by hand."""
import json, os, re, shutil
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "nbs" / "11_quality.ipynb"
SKIP = ("run_grid(", "plot_fraction_results(")   # a model run and a figure written to images/: not prose
FIX = "run `python scripts/run_nb.py nbs/11_quality.ipynb` (and `nbdev_clean`) to save what the page computes now"

def _cells():
    return json.loads(PAGE.read_text())["cells"]

def _src(c)->str:
    return "".join(c["source"])

def _texts(outputs)->list:
    "What a cell shows in words: its Markdown outputs and its printed lines (consecutive streams joined)."
    out = []
    for o in outputs:
        data = o.get("data", {})
        if "text/markdown" in data:
            md = data["text/markdown"]
            out.append(("md", "".join(md) if isinstance(md, list) else md))
        elif o.get("output_type") == "stream":
            text = "".join(o["text"]) if isinstance(o["text"], list) else o["text"]
            if out and out[-1][0] == "stream": out[-1] = ("stream", out[-1][1] + text)
            else: out.append(("stream", text))
    return out

def _run_page(cwd:Path)->dict:
    "Every `exec_doc` cell of the page (but a model run and the figure) run now in `cwd`: cell id -> `_texts`."
    from execnb.shell import CaptureShell
    from execnb.nbio import dict2nb
    sh, here, got = CaptureShell(), os.getcwd(), {}
    os.chdir(cwd)
    try:
        for c in _cells():
            if c["cell_type"] != "code" or "#| exec_doc" not in _src(c) or any(s in _src(c) for s in SKIP): continue
            cell = dict2nb({"cells": [dict(c, outputs=[])], "metadata": {}}).cells[0]
            sh.cell(cell)
            if sh.exc: raise RuntimeError(f"a computed cell of the quality page failed:\n{_src(c)[:300]}") from (
                sh.exc[1] if isinstance(sh.exc, tuple) else sh.exc)
            got[c["id"]] = _texts(cell.get("outputs", []))
    finally: os.chdir(here)
    return got

@pytest.fixture(scope="module")
def now():
    return _run_page(ROOT / "nbs")

def test_saved_figures_are_what_the_json_gives(now):
    "Every computed cell's saved output (tables, settings, prose) is what the cell computes from the JSON now."
    saved = {c["id"]: _texts(c.get("outputs", [])) for c in _cells()}
    for id, texts in now.items():
        assert texts == saved[id], f"nbs/11_quality.ipynb shows an old output of cell {id}: {FIX}"
    assert sum(bool(t) for t in now.values()) >= 10, sorted(now)      # the tables and the prose, not only imports

def _prose(now)->str:
    return " ".join(" ".join(t for kind, t in texts if kind == "md") for texts in now.values())

def test_the_prose_quotes_the_committed_run(now):
    "A few figures of the committed run, as the prose quotes them (a check of the helpers on real data)."
    text = " ".join(_prose(now).split())
    for want in ("makes it **15/15 at both 25% and 12.5%**", "The recommended configuration retrieves **10/10**",
                 "is met by the split rows only", "The full cache retrieves 28/30 keys",
                 "SnapKV closes 93-96% of StreamingLLM's gap", "With the proxy, H2O is no better than"):
        assert want in text, want

def test_the_prose_turns_with_its_json(tmp_path):
    "Change a result under the page and its figures and verdicts change with it: nothing in them is typed by hand."
    shutil.copytree(ROOT / "nbs" / "results", tmp_path / "results")
    f8 = tmp_path / "results" / "quality_fraction_8k.json"
    run = json.loads(f8.read_text())
    from veloxquant_mlx.eval.results import HEADLINE_ROWS
    row = next(r for r in run["rows"] if r["task"] == "passkey" and r["name"] == HEADLINE_ROWS[0]
               and r["family"] == "pydoc")
    row["accuracy"] = 2 / row["samples"]            # the recommended split loses 3 of its 5 pydoc keys at 8k
    f8.write_text(json.dumps(run))
    grid = json.loads((tmp_path / "results" / "quality.json").read_text())
    pp = {(r["name"], r["budget"]): r for r in grid["rows"] if r["task"] == "perplexity"}
    proxy, stream = pp[("h2o/key_proxy", 256)], pp[("streaming", 256)]
    proxy["nll_per_text"] = [x - 0.5 - 0.01 * i for i, x in enumerate(stream["nll_per_text"])]   # clearly lower
    (tmp_path / "results" / "quality.json").write_text(json.dumps(grid))
    text = " ".join(_prose(_run_page(tmp_path)).split())
    assert "The recommended configuration retrieves **7/10**" in text
    assert "is met by split rows only, 3 of the 4" in text and "is met by the split rows only" not in text
    assert "With the proxy, H2O is better only at 256 than keeping the most recent tokens" in text

FIGURE = re.compile(r"\b\d+/\d+\b"                 # hits: 13/15
                    r"|[+-]\d+(\.\d+)?\s?%"          # changes: +47.5%
                    r"|\b\d+\.\d{2,}\b"              # scores, nats, ratios: 0.42, 0.74
                    r"|\b\d[\d,.]*\s?(MiB|GiB|GB|min)\b"   # memory and time
                    r"|\b\d+(\.\d+)?x\b")            # factors: 2.7x

def test_results_sections_type_no_result_figure():
    "The markdown of the results sections carries settings at most: every result figure is computed."
    cells, on = _cells(), False
    for c in cells:
        if c["cell_type"] == "markdown" and _src(c).startswith("## Results"): on = True
        if not on or c["cell_type"] != "markdown": continue
        m = FIGURE.search(_src(c))
        assert m is None, f"a figure typed by hand in the quality page ({m.group(0)!r}):\n{_src(c)[:300]}"

def test_the_lint_finds_typed_figures():
    for typed in ("SnapKV 2/15 and 4/15", "+47.5% at 25%", "scores 0.13 / 0.27", "peaks at 3,310 MiB", "a factor 2.7x"):
        assert FIGURE.search(typed), typed
    for setting in ("25% and 12.5% of the full cache", "2,048-token prompts", "budget 128", "1e-6 nats/token"):
        assert not FIGURE.search(setting), setting

# The other pages whose results prose is computed: their markdown may keep settings, targets and versions (listed),
# never a measured figure. Code spans and links are not prose.
OTHER_PAGES = {"03a_storage": ("1/50", "arXiv:2402.02750"), "04b_planner": (), "05_builder": (),
               "07a_serve": ("mlx-lm 0.32.2", "(0.32.2)"),
               "12_speed": ("1.15x", "1.3x"), "13_batch_speed": ("2.2x", "512 MiB", "48 MiB", "2 GiB", "2x", "3x"),
               "14_distributed": ("mlx-lm 0.32",), "14a_eval_sharding": ("64 GB",), "15_every_task": ("+8 %",),
               "08_reliability": ("1 MiB",), "02_h2o": ("0.3125", "0.85"), "05a_blas": ("0.3.31",)}   # 0.85: the test's bound, derived there

def _prose_of(c)->str:
    return re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", "", _src(c)))

def test_other_results_pages_type_no_result_figure():
    "The pages converted to computed prose keep no measured figure in their markdown (settings and targets allowed)."
    bad = []
    for page, allowed in OTHER_PAGES.items():
        for c in json.loads((ROOT / "nbs" / f"{page}.ipynb").read_text())["cells"]:
            if c["cell_type"] != "markdown": continue
            text = _prose_of(c)
            for a in allowed: text = re.sub(rf"(?<![\w.]){re.escape(a)}(?!\w|\.\d)", "", text)   # whole tokens only
            bad += [f"{page}: {m.group(0)!r} in {text[max(0, m.start() - 60):m.end() + 20]!r}"
                    for m in FIGURE.finditer(text)]
    assert not bad, "figures typed by hand:\n" + "\n".join(bad)
