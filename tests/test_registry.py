"""A new method is one policy and one registry line: everything else (configuration, builder, command line, quality
grid, benchmark kinds, the methods table, saved states) picks it up from the registry without code of its own.

The throwaway method here keeps the *oldest* tokens (a bad idea, but a valid policy); it is registered for the
test and removed afterwards."""
import veloxquant_mlx  # noqa: F401  (loads OpenBLAS before mlx on Linux)
import io, json, os, tempfile
from dataclasses import dataclass
from typing import ClassVar
import mlx.core as mx
import pytest
from mlx_lm.models.cache import save_prompt_cache, load_prompt_cache
from veloxquant_mlx import KVCacheConfig, KVCacheBuilder, EvictingCache, Policy, Method, register, methods_table
from veloxquant_mlx.methods import METHODS
from veloxquant_mlx.policies import POLICIES
from veloxquant_mlx.builder import tiny_model, greedy

@pytest.fixture
def oldest():
    "Register the throwaway method (its policy section and its registry line), and remove it after the test."
    @dataclass
    class Oldest(Policy):                                   # the policy section
        "Keep the oldest tokens: the score is minus the position."
        name:ClassVar[str] = "oldest_first"
        def score(self, view): return -view.positions.astype(mx.float32)
    register(Method("oldest", "Oldest first", "https://example.invalid", "the first tokens", (), lambda p: Oldest()))
    yield Oldest
    del METHODS["oldest"], POLICIES["oldest_first"]

def test_a_new_method_reaches_everything_through_the_registry(oldest):
    from veloxquant_mlx import cli
    from veloxquant_mlx.eval import grid, fraction, bench
    cfg = KVCacheConfig.for_method("oldest", 24)
    model = tiny_model("llama")
    caches = KVCacheBuilder.for_model(model, cfg)
    greedy(model, mx.random.randint(0, 256, (1, 100), key=mx.random.key(0)), caches, 5, chunk=32)
    for c in caches:                                        # it really kept the oldest (and the newest, as every policy)
        assert isinstance(c, EvictingCache) and c.spec.method == "oldest" and c.count == 24
        kept = set(c.positions[0, 0].tolist())
        assert set(range(20)) <= kept and 104 in kept
    with tempfile.TemporaryDirectory() as d:                # a saved state names its policy; loading rebuilds it
        save_prompt_cache(os.path.join(d, "c.safetensors"), caches)
        assert type(load_prompt_cache(os.path.join(d, "c.safetensors"))[0].policy) is oldest
    assert "`oldest`" in methods_table()                    # the docs' table of methods
    assert "oldest" in cli.build_parser().parse_args(["generate", "--method", "oldest", "hi"]).method
    buf = io.StringIO()
    assert cli.main(["generate", "--model", "tiny:llama", "--method", "oldest", "--budget", "16", "--max-tokens", "3",
                     "--json", "hello " * 20], out=buf) == 0
    assert json.loads(buf.getvalue())["method"] == "oldest"
    assert "oldest" in [c.label for c in grid.grid_configs(64)]             # the token grid
    assert "oldest" in [fraction.row_name(r) for r in fraction.fraction_rows()]  # the fraction grid
    assert "oldest" in bench.decode_kinds()                                     # the speed benchmark
