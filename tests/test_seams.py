"""The seams of the package: modules import one way (no cycles), each imports alone, and the core's interfaces hold.

The import graph is read from the source (`from .x import`, `from veloxquant_mlx.x import`, `import veloxquant_mlx.x`,
at any depth: a lazy import inside a function is still an edge)."""
import ast, pathlib, subprocess, sys
import pytest

PKG = pathlib.Path(__file__).resolve().parent.parent / "veloxquant_mlx"
CORE = ("h2o", "policies", "native", "storage_base", "storage_group", "storage_kivi", "storage", "cache", "batch_kivi",
        "batch", "coordinator")
KNOWN_ELSEWHERE = []  # no module cycle is allowed (cli and serve: the server plugs into the CLI, one way)


def modules() -> list:
    return sorted(p.stem for p in PKG.glob("*.py") if p.stem not in ("__init__", "_modidx"))


def imports_of(name: str) -> set:
    "The package modules `name` imports (itself excluded)."
    tree, out = ast.parse((PKG / f"{name}.py").read_text()), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level == 1: target = mod.split(".")[0] if mod else None
            elif mod.startswith("veloxquant_mlx."): target = mod.split(".")[1]
            elif mod == "veloxquant_mlx": target = None
            else: continue
            names = [target] if target else [a.name for a in node.names]      # `from . import x`, `from pkg import x`
            out.update(n for n in names if (PKG / f"{n}.py").exists())
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("veloxquant_mlx."): out.add(a.name.split(".")[1])
    out.discard(name)
    return out


def cycles(graph: dict) -> list:
    "The strongly connected components of more than one module (Tarjan)."
    index, low, stack, on, comps, n = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1
        stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index: visit(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop(); on.discard(w); comp.add(w)
                if w == v: break
            if len(comp) > 1: comps.append(comp)
    for v in graph:
        if v not in index: visit(v)
    return comps


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_parser_sees_lazy_and_absolute_imports():
    g = {m: imports_of(m) for m in modules()}
    assert {"h2o", "policies", "storage"} <= g["cache"]
    assert "cache" in g["batch"]


def test_no_import_cycle_between_package_modules():
    g = {m: imports_of(m) for m in modules()}
    found = cycles(g)
    assert not [c for c in found if c & set(CORE)], f"import cycles through the core: {found}"
    assert all(c in KNOWN_ELSEWHERE for c in found), f"import cycles: {found}"


def test_the_core_imports_nothing_above_it():
    "The core modules import only the core and the pure helpers below it (proxy, allocators), never the harness."
    below = set(CORE) | {"proxy", "allocators"}
    for m in CORE: assert imports_of(m) <= below, f"{m} imports {imports_of(m) - below}"


@pytest.mark.parametrize("name", modules())
def test_each_module_imports_alone(name):
    r = subprocess.run([sys.executable, "-c", f"import veloxquant_mlx.{name}"], capture_output=True, text=True,
                       timeout=300, cwd=PKG.parent)
    assert r.returncode == 0, r.stderr[-2000:]


# --- declared seams -------------------------------------------------------------------------------------------------

def _source(name: str) -> str:
    return (PKG / f"{name}.py").read_text()


def test_one_decode_step_for_one_row_and_many():
    "The single layer and the batch both call `h2o.decode_step`; neither writes the newcomer's slot itself."
    import re
    for name in ("cache", "batch"):
        assert re.search(r"\bdecode_step\(", _source(name)), f"{name} does not call decode_step"
        assert "eviction_priority(" not in _source(name) or name == "batch", f"{name} ranks victims itself"


def test_the_batch_writes_no_private_field_of_a_row():
    import re
    src = _source("batch")
    bad = re.findall(r"\b(?:r|row|rows\[\w+\])\._\w+(?:\s*,\s*\w+(?:\.\w+)*)*\s*=(?!=)", src)
    assert not bad, f"the batch writes a row's private fields: {bad}"


def test_storage_declares_everything_the_cache_and_the_batch_use():
    import re
    from veloxquant_mlx.storage import Storage, FloatStorage, GroupStorage, KiviStorage
    declared = set(dir(Storage)) | set(Storage.__annotations__)
    used = {m for name in ("cache", "batch") for m in re.findall(r"\bstore\.(\w+)", _source(name))}
    assert used, "the parser found no storage use"
    assert used <= declared, f"used but not declared by Storage: {sorted(used - declared)}"
    assert "quantized" not in used, "the cache branches on the storage's kind"
    for cls in (FloatStorage, GroupStorage, KiviStorage):           # every declared method is implemented
        for m in used - set(Storage.__annotations__) - {"needs_hook", "scheme", "stacks"}:   # (settings, not methods)
            if m in ("take_part",) and not cls.stacks: continue       # only a storage that stacks implements it
            assert getattr(cls, m) is not getattr(Storage, m) or m in ("check_count", "put", "settle", "truncate", "state", "min_keep"), (cls, m)


def test_one_coordinator_base_and_no_probing():
    from veloxquant_mlx.coordinator import Coordinator, SqueezeCoordinator, PromptEndCoordinator
    assert issubclass(SqueezeCoordinator, Coordinator) and issubclass(PromptEndCoordinator, Coordinator)
    for name in ("cache", "batch"):
        for probe in ("getattr(co", "hasattr(co", "getattr(coordinator", "hasattr(coordinator"):
            assert probe not in _source(name), f"{name} probes the coordinator: {probe}"


@pytest.mark.parametrize("kw,named", [(dict(policy=object()), "`policy`"), (dict(storage="float"), "`storage`"),
                                      (dict(coordinator=object()), "`coordinator`")])
def test_a_wrong_plug_in_fails_when_built(kw, named):
    from veloxquant_mlx.cache import EvictingCache
    with pytest.raises(TypeError, match=named): EvictingCache(8, **kw)


def test_policy_phases_replace_the_kind_checks():
    "No `isinstance(..., KeyProxy)` in the cache or the batch: the policy's `on_keys` phase decides."
    for name in ("cache", "batch"): assert "isinstance(self.policy" not in _source(name)
    for name in ("cache", "batch"): assert "KeyProxy)" not in _source(name).replace("KeyProxy()", "")


# The public face of the one evicting cache: mlx-lm's protocol, what it holds, its plug-ins and settings, and the calls
# a schedule or a user makes. At most 25 (issue #20). A new public name is a decision: add it here.
EVICTING_CACHE_PUBLIC = {
    # mlx-lm's cache protocol (size() is the token count's protocol name; count the attribute)
    "update_and_fetch", "make_mask", "state", "meta_state", "nbytes", "is_trimmable", "trim", "empty", "size",
    "from_state", "merge", "offset",
    # what it holds and may hold
    "count", "budget", "positions",
    # its plug-ins and its settings (`LayerSpec`: sinks, window, recent, slack, compress, layer index, method)
    "policy", "store", "coordinator", "spec",
    # attention through the hook; a schedule's calls; what it reports
    "attention", "end_prompt", "adopt_budget", "reset", "report_hidden", "stats",
}


def test_evicting_cache_public_members_are_listed():
    from veloxquant_mlx.cache import EvictingCache
    c = EvictingCache(8)
    public = {n for n in dir(EvictingCache) if not n.startswith("_")} | {n for n in vars(c) if not n.startswith("_")}
    assert public == EVICTING_CACHE_PUBLIC, (f"new: {sorted(public - EVICTING_CACHE_PUBLIC)}, "
                                             f"gone: {sorted(EVICTING_CACHE_PUBLIC - public)}")
    assert len(EVICTING_CACHE_PUBLIC) <= 25


def test_the_presets_are_registry_factories():
    "`H2OCache` & co. build `EvictingCache`s through their method's `layer`; the builder never bypasses a constructor."
    from veloxquant_mlx import H2OCache, PyramidKVCache, SnapKVCache, SqueezeAttentionCache, EvictingCache
    from veloxquant_mlx.methods import METHODS
    for f, name in ((H2OCache, "h2o"), (PyramidKVCache, "pyramidkv"), (SnapKVCache, "snapkv"),
                    (SqueezeAttentionCache, "squeeze")):
        c = f(64, 2)
        assert type(c) is EvictingCache and c.spec.method == name and name in METHODS
    src = _source("builder")
    assert "__new__" not in src and 'method == "squeeze"' not in src and "preset" not in _source("methods")


def test_one_fit_rule():
    "The rule that fits a policy, the recent tokens and the slack to a budget is written once (`cache.fit`)."
    import re
    for name in ("cache", "builder", "planner", "coordinator", "batch"):
        assert not re.search(r"max\(0, min\(\w*slack", _source(name).replace("def fit", "")) or name == "cache", name
    assert _source("cache").count("max(0, min(slack") == 1
