"""Isolation (issue 21): a request's tokens never depend on what other requests did before or beside it. Random sequences
of requests (shared prefixes, different lengths, some sent one after another so mlx-lm's prompt cache could reuse an
earlier request's caches, some at once, some cancelled by a client that goes away mid-stream) go through the real server
(`EvictingServer` over HTTP on 127.0.0.1) and through mlx-lm's `BatchGenerator` directly; every answer that completes
must equal a fresh single run of its prompt with the same configuration (greedy)."""
import veloxquant_mlx  # noqa: F401  (loads OpenBLAS before mlx on Linux)
import http.client, json, random, urllib.error, urllib.parse, urllib.request
from concurrent.futures import ThreadPoolExecutor
import pytest
from veloxquant_mlx.batch import greedy_alone, greedy_batched
from veloxquant_mlx.builder import KVCacheBuilder, tiny_model
from veloxquant_mlx.cli import method_config
from veloxquant_mlx.serve import EvictingServer, tiny_tokenizer, PREFILL_STEP

WORDS = "the pass key is 52817 remember it cache batch layer token budget evict keep prompt".split()
MODELS, ALONE = {}, {}

def model_for(arch):
    if arch not in MODELS: MODELS[arch] = tiny_model(arch)
    return MODELS[arch]

def random_requests(seed:int, n:int=8):
    "(prompt, max_tokens, cancel) triples: prompts that share prefixes, of 5 to ~200 bytes; about one in four cancelled."
    rng = random.Random(seed)
    stems = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(3)]
    out = []
    for _ in range(n):
        p = rng.choice(stems)[:rng.randint(5, 80)]
        if rng.random() < 0.7: p += " " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 25)))
        out.append((p, rng.randint(2, 10), rng.random() < 0.25))
    return out

def alone(arch, cfg, prompt, max_tokens, step=PREFILL_STEP):
    "Greedy token ids of `prompt` alone, with fresh caches of `cfg` (memoised); 400 when the configuration refuses it."
    key = (arch, cfg.label, cfg.budget, prompt, max_tokens, step)
    if key not in ALONE:
        model = model_for(arch)
        try: ALONE[key] = greedy_alone(model, tiny_tokenizer().encode(prompt), KVCacheBuilder.for_model(model, cfg),
                                       max_tokens, step)                      # the prefill chunk
        except ValueError: ALONE[key] = 400        # e.g. too short for kv_fraction's floors (generate refuses it too)
    return ALONE[key]

def complete(url, prompt, max_tokens):
    "POST /v1/completions (greedy); the generated token ids."
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "logprobs": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r: out = json.load(r)
    except urllib.error.HTTPError as e: return e.code
    return [t["id"] for t in out["choices"][0]["logprobs"]["content"]]

def cancelled(url, prompt, max_tokens):
    "A streamed request whose client reads one event and goes away."
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens + 50, "temperature": 0.0, "stream": True})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    r.fp.readline()
    conn.close()

def send(url, req):
    prompt, max_tokens, cancel = req
    if cancel: return cancelled(url, prompt, max_tokens)
    return complete(url, prompt, max_tokens)

CONFIGS = [("gemma3", "squeeze", 12, {}), ("gemma3", "h2o", 12, {}), ("llama", "snapkv", 40, {}),
           ("llama", "tova", 12, dict(compress="chunk")), ("gemma3", "full", None, {}), ("gemma3", "auto", None, {})]

@pytest.mark.parametrize("arch,method,budget,shared", CONFIGS, ids=[f"{a}-{m}" for a, m, _, _ in CONFIGS])
def test_server_answers_equal_fresh_runs(arch, method, budget, shared):
    cfg = method_config(method, budget, **shared)
    model = tiny_model(arch)                     # its own instance: the server installs its caches on it
    srv = EvictingServer(model, tiny_tokenizer(), cfg, ["--port", "0", "--decode-concurrency", "3",
                                                        "--prompt-concurrency", "2", "--log-level", "ERROR"]).start()
    try:
        for seed in range(3):
            reqs = random_requests(seed + 10 * len(method))
            served = [send(srv.url, r) for r in reqs[:4]]                       # one after another: prompt-cache reuse
            with ThreadPoolExecutor(4) as ex: served += list(ex.map(lambda r: send(srv.url, r), reqs[4:]))  # at once
            for (p, n, cancel), got in zip(reqs, served):
                if not cancel: assert got == alone(arch, cfg, p, n), (seed, p, n)
    finally: srv.stop()

def batched(model, cfg, reqs, fair=False):
    """Token ids of `reqs` through one mlx-lm `BatchGenerator`, one joining every other step; a cancelled request is
    removed after its second token (the server's `remove` when a client goes)."""
    from mlx_lm.generate import BatchGenerator
    from veloxquant_mlx.serve import FairBatchGenerator                      # the server's
    gen = (FairBatchGenerator if fair else BatchGenerator)(model, stop_tokens=None, completion_batch_size=3,
                                                           prefill_batch_size=2, prefill_step_size=64)
    tok = tiny_tokenizer()
    uids, toks, done, pending, step = {}, {}, set(), list(enumerate(reqs)), 0
    while pending or len(done) < len(uids):
        if pending and step % 2 == 0:
            i, (p, n, cancel) = pending.pop(0)
            (u,) = gen.insert([tok.encode(p)], [n + 50 if cancel else n], [KVCacheBuilder.for_model(model, cfg)])
            uids[u] = i
        for r in gen.next()[1]:
            toks.setdefault(uids[r.uid], []).append(r.token)
            if r.finish_reason is not None: done.add(r.uid)
        gone = [u for u, i in uids.items() if reqs[i][2] and u not in done and len(toks.get(i, [])) >= 2]
        if gone: gen.remove(gone)
        done.update(gone)
        step += 1
        assert step < 10_000, "batch generation did not finish"
    gen.close()
    return [toks.get(i) for i in range(len(reqs))]

BATCH_CONFIGS = [CONFIGS[i] for i in (0, 1, 2, 3, 5)]

@pytest.mark.parametrize("fair", [False, True], ids=["mlx", "fair"])
@pytest.mark.parametrize("arch,method,budget,shared", BATCH_CONFIGS, ids=[f"{a}-{m}" for a, m, _, _ in BATCH_CONFIGS])
def test_batch_generator_answers_equal_fresh_runs(arch, method, budget, shared, fair):
    cfg, model = method_config(method, budget, **shared), model_for(arch)
    for seed in range(3):
        reqs = [r for r in random_requests(seed) if alone(arch, cfg, r[0], r[1], 64) != 400]
        got = batched(model, cfg, reqs, fair)
        for (p, n, cancel), g in zip(reqs, got):
            if not cancel: assert g == alone(arch, cfg, p, n, 64), (seed, p, n)

@pytest.mark.parametrize("method,budget", [("squeeze", 24), ("h2o", 24), ("snapkv", 40), ("full", None)])
def test_short_request_then_long_one(method, budget):
    "The issue's repro in small: a short completion, then a long prompt sharing its first tokens, answers as alone."
    cfg = method_config(method, budget)
    short = "it"                                    # with what it generates, under every budget: nothing evicted
    long = "it remember " + " ".join(WORDS * 4) + " What is the pass key? The pass key is"
    srv = EvictingServer(tiny_model("gemma3"), tiny_tokenizer(), cfg, ["--port", "0", "--log-level", "ERROR"]).start()
    try:
        complete(srv.url, short, 6)
        got = complete(srv.url, long, 8)
    finally: srv.stop()
    assert got == alone("gemma3", cfg, long, 8)

@pytest.mark.parametrize("method,budget,shared", [("tova", 48, dict(compress="chunk")), ("auto", None, {})])
def test_long_prompt_read_in_generates_chunks(method, budget, shared):
    "A prompt of several prefill chunks, next to a short request, answers as `generate` (512-token chunks) does."
    cfg = method_config(method, budget, **shared)
    long, short = " ".join(WORDS * 20)[:1400], "Count: " + " ".join(WORDS * 20)[:300]
    srv = EvictingServer(tiny_model("gemma3"), tiny_tokenizer(), cfg, ["--port", "0", "--log-level", "ERROR"]).start()
    try:
        with ThreadPoolExecutor(2) as ex: got = list(ex.map(lambda p: complete(srv.url, p, 6), [long, short]))
    finally: srv.stop()
    assert got == [alone("gemma3", cfg, long, 6), alone("gemma3", cfg, short, 6)]

def test_requests_choosing_their_configuration_answer_as_alone():
    "Requests that chose different configurations (operator-allowed), batched together, each answer as alone."
    from veloxquant_mlx.cli import build_parser
    from veloxquant_mlx.serve import parse_allowed, request_choices, request_config, http_json
    args = build_parser().parse_args(["serve", "--method", "h2o", "--budget", "24"])
    choices = request_choices(args, parse_allowed(["method=h2o,snapkv,tova", "budget=24,48"]))
    srv = EvictingServer(tiny_model("gemma3"), tiny_tokenizer(), method_config("h2o", 24),
                         ["--port", "0", "--log-level", "ERROR"], choices=choices).start()
    asks = [None, {"method": "snapkv", "budget": 48}, {"method": "tova"}, {"budget": 48}, {"method": "snapkv"}]
    prompts = [" ".join(WORDS[i:] + WORDS[:i]) * 2 for i in range(len(asks))]
    def ask(i):
        body = {"prompt": prompts[i], "max_tokens": 6, "temperature": 0.0, "logprobs": True}
        if asks[i] is not None: body["kv_cache"] = asks[i]
        status, out = http_json(srv.url, "/v1/completions", body)
        return [t["id"] for t in out["choices"][0]["logprobs"]["content"]] if status == 200 else status
    try:
        with ThreadPoolExecutor(len(asks)) as ex: got = list(ex.map(ask, range(len(asks))))
        refused = http_json(srv.url, "/v1/completions", {"prompt": "hi", "kv_cache": {"method": "squeeze"}})
    finally: srv.stop()
    cfgs = [request_config(a, choices) or method_config("h2o", 24) for a in asks]
    assert got == [alone("gemma3", c, p, 6) for c, p in zip(cfgs, prompts)]
    assert len({c.label + str(c.budget) for c in cfgs}) == 5                  # five different configurations
    assert refused[0] == 400 and "is not a choice on this server" in refused[1]["error"]["message"]
