"""`veloxquant_mlx.blas`: the OpenBLAS preload, each case in a fresh interpreter (the preload only
works before the first `import mlx.core`, so it cannot be exercised in the pytest process)."""
import json, os, subprocess, sys
import pytest
from veloxquant_mlx.blas import (find_openblas, wheel_openblas, wheel_runs_here, mlx_gfortran, OPT_OUT_ENV, SOURCES_ENV,
                                 SLOW_BLAS_WARNING, FIX_PIP)
WARNING_HEAD = SLOW_BLAS_WARNING.split('{')[0][:40]

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
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if "/" in l})
print(json.dumps({"loaded": status.loaded, "path": status.path, "reason": status.reason,
                  "same": blas_status() == status, "err": err, "maps": maps}))
"""

def run_child(code=CHILD, opt_out=False, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k not in (OPT_OUT_ENV, SOURCES_ENV, "LD_PRELOAD")}
    if opt_out: env[OPT_OUT_ENV] = "1"
    env.update(env_extra or {})
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr

def test_matmul_correct_after_preload():
    r, _ = run_child()
    assert r["err"] < 1e-3, r
    assert r["same"]

@pytest.mark.skipif(not sys.platform.startswith("linux") or find_openblas() is None,
                    reason="needs a system OpenBLAS on Linux (apt-get install libopenblas0-pthread): the preload of "
                           "the system library is not tested")
def test_status_says_loaded():
    r, _ = run_child()
    assert r["loaded"] and r["path"], r
    assert "openblas" in r["path"].lower()

@pytest.mark.skipif(not sys.platform.startswith("linux") or wheel_openblas() is None or mlx_gfortran() is None
                    or wheel_runs_here(wheel_openblas()) is not None,
                    reason="needs Linux with the cmeel-openblas and mlx[cpu] wheels, on a CPU the wheel's build runs "
                           "on: the preload of the wheel's OpenBLAS (no system library) is not tested")
def test_wheel_openblas_serves_mlx_with_system_skipped(tmp_path):
    "The fresh-machine path: no system library, the wheel's OpenBLAS with MLX's renamed libgfortran."
    r, err = run_child(env_extra={SOURCES_ENV: "wheel", "XDG_CACHE_HOME": str(tmp_path)})
    assert r["loaded"] and "cmeel" in r["reason"], r
    assert r["path"] == str(wheel_openblas()), r
    assert r["path"] in r["maps"]                                       # the wheel's OpenBLAS is mapped
    patched = [m for m in r["maps"] if m.startswith(str(tmp_path)) and m.endswith("libgfortran.so.5")]
    assert patched, r["maps"]                                           # through the patched copy in the cache
    assert not any(m.startswith("/usr/lib") and "openblas" in m for m in r["maps"]), r["maps"]
    assert r["err"] < 1e-3 and r["same"], r
    assert WARNING_HEAD not in err

def test_no_openblas_says_so_once_on_stderr():
    code = ("import json\nfrom veloxquant_mlx.blas import preload_openblas\n"
            "s = preload_openblas(); preload_openblas(); preload_openblas(force=False)\n"
            "print(json.dumps({'loaded': s.loaded, 'reason': s.reason}))")
    r, err = run_child(code, env_extra={SOURCES_ENV: "none"})
    assert not r["loaded"], r
    if sys.platform.startswith("linux"):
        lines = [l for l in err.splitlines() if "no OpenBLAS found" in l]
        assert lines == [SLOW_BLAS_WARNING.format(fix=FIX_PIP)], err   # one line, once, with the fix
        assert "GFLOP/s" in lines[0] and "pip install cmeel-openblas" in lines[0]

def test_bad_sources_value_is_named_and_does_not_break_import():
    r, err = run_child(env_extra={SOURCES_ENV: "conda"})
    assert not r["loaded"] and SOURCES_ENV in r["reason"] and "'conda'" in r["reason"], r
    assert r["err"] < 1e-3

def test_opt_out_respected():
    r, err = run_child(opt_out=True)
    assert not r["loaded"] and OPT_OUT_ENV in r["reason"], r
    assert r["err"] < 1e-3
    assert WARNING_HEAD not in err                            # opting out is deliberate: no warning

def test_preload_after_mlx_warns_and_does_not_load():
    code = ("import warnings, json, mlx.core\n"
            "from veloxquant_mlx import blas\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    s = blas.preload_openblas(force=True)\n"
            "print(json.dumps({'loaded': s.loaded, 'reason': s.reason, 'warned': any('mlx.core' in str(x.message) for x in w)}))")
    r, _ = run_child(code)
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
    assert run_child(code)[0] == {"mlx": False}
