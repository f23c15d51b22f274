"""One source for every knob: each `KVCacheConfig` field declares its option and its place in labels, each method
parameter that is a policy's or schedule's field is read from that field, and no list of field names is kept by hand.

The parsers of `generate`, `compare` and `serve` are built and read back (`parse_args` with no options gives every
default); the package's source is scanned for literal lists of field names."""
import ast, pathlib
from dataclasses import fields

import pytest
from fastcore.docments import docments

from veloxquant_mlx import builder, cli
from veloxquant_mlx.builder import KVCacheConfig
from veloxquant_mlx.coordinator import Pyramid, Squeeze
from veloxquant_mlx.methods import METHODS, Param
from veloxquant_mlx.policies import Policy, ObservationWindow, ChunkKV

PKG = pathlib.Path(__file__).resolve().parent.parent / "veloxquant_mlx"
FIELDS = {f.name: f for f in fields(KVCacheConfig)}
INTERNAL = {n for n, f in FIELDS.items() if not f.metadata["cli"]}   # declared: no generated option
COMMANDS = {"generate": ["generate", "x"], "compare": ["compare", "x"], "serve": ["serve"]}


def option(parser, command, name):
    "The argparse action of `command` whose destination is `name` (None if it has none)."
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    return next((a for a in sub._actions if a.dest == name), None)


# --- the configuration's fields are the options ---------------------------------------------------------------------

def test_only_the_declared_fields_are_internal():
    assert INTERNAL == {"method", "params", "head_dim"}      # --method/--methods, one option per parameter, the model's


@pytest.mark.parametrize("command", COMMANDS)
def test_every_field_has_an_option_with_its_default_and_choices(command):
    ap = cli.build_parser()
    args = ap.parse_args(COMMANDS[command])
    for name, f in FIELDS.items():
        if name in INTERNAL: continue
        a = option(ap, command, name)
        assert a is not None, f"{command}: no option for field {name!r}"
        assert a.option_strings == [f.metadata.get("flag", "--" + name.replace("_", "-"))]
        want = f.default if f.metadata["cli"] == "field" else None          # None: "not given", the method decides
        assert getattr(args, name) == want and a.default == want, (command, name)
        assert a.choices == f.metadata.get("choices"), (command, name)
        assert a.help.startswith(cli._as_options(docments(KVCacheConfig)[name])), (command, name)


def test_the_fields_with_the_fields_own_default_are_sinks_and_recent():
    assert {n for n, f in FIELDS.items() if f.metadata["cli"] == "field"} == {"n_sink", "n_recent"}
    assert (FIELDS["n_sink"].default, FIELDS["n_recent"].default) == (4, 0)


def test_an_option_value_reaches_the_configuration():
    ap = cli.build_parser()
    args = ap.parse_args(["generate", "--method", "h2o", "--budget", "64", "--recent", "3", "--compress", "chunk",
                          "--kv-bits", "4", "--kv-group-size", "32", "--schedule", "pyramid", "x"])
    cfg = cli.configs_from_args(args, ["h2o"])[0]
    assert (cfg.budget, cfg.n_recent, cfg.compress, cfg.kv_bits, cfg.kv_group_size, cfg.schedule) == \
        (64, 3, "chunk", 4, 32, "pyramid")


def test_a_bad_option_value_names_the_option():
    with pytest.raises(cli.CLIError, match="--kv-bits must be an integer or 'auto', got 'four'"):
        cli.build_parser().parse_args(["generate", "--kv-bits", "four", "x"])
    with pytest.raises(cli.CLIError, match="--kv-group-size must be one of"):
        cli.method_config("h2o", 64, kv_bits=4, kv_group_size=100)


# --- no hand-kept lists ---------------------------------------------------------------------------------------------

def test_config_fields_are_derived():
    assert cli.CONFIG_FIELDS == tuple(n for n in FIELDS if n not in INTERNAL)
    assert not hasattr(builder, "_SHARED")


def literal_name_lists(path, names, least=4):
    "(line, names) of every tuple/list/set literal or dict display in `path` with `least` or more of `names`."
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        elts = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(node, (ast.Tuple, ast.List,
                                                                                             ast.Set)) else []
        got = [e.value for e in elts if isinstance(e, ast.Constant) and e.value in names]
        if len(got) >= least: out.append((node.lineno, got))
    return out


def test_the_checker_finds_a_hand_kept_list(tmp_path):
    p = tmp_path / "m.py"
    p.write_text('X = ("compress", "slack", "kv_bits", "kv_scheme")\nY = ("compress", "other")\n')
    assert literal_name_lists(p, set(FIELDS)) == [(1, ["compress", "slack", "kv_bits", "kv_scheme"])]


@pytest.mark.parametrize("path", sorted(PKG.glob("*.py")), ids=lambda p: p.name)
def test_no_module_keeps_a_list_of_field_names(path):
    assert not literal_name_lists(path, set(FIELDS) - {"method", "budget"}), path.name


# --- labels ---------------------------------------------------------------------------------------------------------

def test_the_label_names_every_labelled_field_and_reads_back(tmp_path):
    from veloxquant_mlx.planner import save_rung_table, RUNG_QUALITY
    save_rung_table(RUNG_QUALITY[64], tmp_path / "rungs.json")
    labelled = [n for n, f in FIELDS.items() if f.metadata["label"]]
    assert labelled == list(cli.CONFIG_FIELDS[2:])        # every option but the budget and the sinks, in field order
    c = KVCacheConfig.for_method("h2o", 64, n_recent=2, compress="chunk", slack=1, window_budget=20, kv_bits=4,
                                 kv_group_size=32, kv_scheme="group", schedule="uniform")
    f = KVCacheConfig.for_method("snapkv", kv_fraction=0.5, window_method="tova", kv_bits=4, window_kv_bits=8,
                                 global_slack=15)
    q = KVCacheConfig.for_method("chunkkv", kv_fraction=0.25, kv_bits="auto", kv_quality=str(tmp_path / "rungs.json"))
    named = {part.split("=")[0] for x in (c, f, q) for part in x.label.split("[")[1].rstrip("]").split(",")}
    assert named == set(labelled)
    assert KVCacheConfig.from_label(c.label, 64) == c and KVCacheConfig.from_label(f.label) == f
    assert KVCacheConfig.from_label(q.label) == q


# --- method parameters from their policy's or schedule's field, and dead code gone ---------------------------------

@pytest.mark.parametrize("method,owner,name", [("snapkv", ObservationWindow, "obs_window"),
                                               ("snapkv", ObservationWindow, "kernel"),
                                               ("snapkv", ObservationWindow, "pool"), ("chunkkv", ChunkKV, "chunk"),
                                               ("keynorm", Policy, "chunk"), ("pyramidkv", Pyramid, "beta"),
                                               ("squeeze", Squeeze, "strength"), ("squeeze", Squeeze, "signal")])
def test_a_method_parameter_is_its_fields_default(method, owner, name):
    params = {p.name: p for p in METHODS[method].params}
    assert params[name].default == getattr(owner(), name)
    assert params[name] == Param.of(owner, name, params[name].help, choices=params[name].choices)


def test_the_registrys_measured_defaults():
    params = {p.name: p for m in METHODS.values() for p in m.params}
    assert (params["score"].default, params["signal"].default) == ("attention", "hidden_cosine")


def test_dead_code_is_gone():
    assert not hasattr(KVCacheConfig, "with_budget")
    assert not hasattr(builder, "remove_hidden_signal_hooks")
