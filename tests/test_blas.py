"""`veloxquant_mlx.blas`: the OpenBLAS preload, each case in a fresh interpreter (the preload only
works before the first `import mlx.core`, so it cannot be exercised in the pytest process)."""
import json, os, subprocess, sys
import pytest
from veloxquant_mlx.blas import find_openblas, OPT_OUT_ENV

CHILD = r"""
import json, sys, warnings
warnings.simplefilter("error")            # a warning from the preload would be a failure here
from veloxquant_mlx.blas import preload_openblas, blas_status
status = preload_openblas()
import mlx.core as mx
import numpy as np
rng = np.random.default_rng(0)
a, b = rng.standard_normal((300, 200)).astype(np.float32), rng.standard_normal((200, 100)).astype(np.float32)
c = np.array(mx.array(a) @ mx.array(b))
err = float(np.abs(c - a @ b).max())
print(json.dumps({"loaded": status.loaded, "path": status.path, "reason": status.reason,
                  "same": blas_status() == status, "err": err}))
"""

def run_child(code=CHILD, opt_out=False):
    env = {k: v for k, v in os.environ.items() if k not in (OPT_OUT_ENV, "LD_PRELOAD")}
    if opt_out: env[OPT_OUT_ENV] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])

def test_matmul_correct_after_preload():
    r = run_child()
    assert r["err"] < 1e-3, r
    assert r["same"]

@pytest.mark.skipif(not sys.platform.startswith("linux") or find_openblas() is None,
                    reason="no system OpenBLAS installed (apt-get install libopenblas0-pthread)")
def test_status_says_loaded():
    r = run_child()
    assert r["loaded"] and r["path"], r
    assert "openblas" in r["path"].lower()

def test_opt_out_respected():
    r = run_child(opt_out=True)
    assert not r["loaded"] and OPT_OUT_ENV in r["reason"], r
    assert r["err"] < 1e-3

def test_preload_after_mlx_warns_and_does_not_load():
    code = ("import warnings, json, mlx.core\n"
            "from veloxquant_mlx import blas\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    s = blas.preload_openblas(force=True)\n"
            "print(json.dumps({'loaded': s.loaded, 'reason': s.reason, 'warned': any('mlx.core' in str(x.message) for x in w)}))")
    r = run_child(code)
    if r["loaded"]:   # the package __init__ already preloaded before mlx.core: nothing left to warn about
        assert r["reason"] == "already loaded in this process"
    else:
        assert r["warned"] and "already imported" in r["reason"], r

def test_blas_module_does_not_import_mlx():
    "Load blas.py on its own (the package `__init__` may import more) and check it leaves mlx alone."
    import veloxquant_mlx.blas as blas
    code = ("import sys, json, importlib.util\n"
            f"spec = importlib.util.spec_from_file_location('blas_alone', {blas.__file__!r})\n"
            "m = sys.modules['blas_alone'] = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "print(json.dumps({'mlx': 'mlx.core' in sys.modules}))")
    assert run_child(code) == {"mlx": False}
