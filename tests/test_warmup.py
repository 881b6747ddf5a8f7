"""The joint systems' format warm-up (issue 25 §2): which trace rows train and which probe, the token sequences SFT
trains on (the engines' own encoding, EOS only where the trace ended on it), the held-out format probe per role,
the stop at the threshold or the cap, and where train_joint and the `<system>_warmup` rows start from."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragteam.config import load_params
from ragteam.eval.evaluate import SystemSpec, comparison_pairs, make_team
from ragteam.io import DataError
from ragteam.llm import EngineConfig, SamplingConfig, chat_text
from ragteam.systems.registry import oracle_system
from ragteam.systems.decor import roles as D
from ragteam.warmup.sft import FormatProbe, WarmupParams, per_role, sft_ids, split_heldout, tokenized_rows
from ragteam.warmup.start import WARMUP_OFF, start_model

REPO = Path(__file__).resolve().parents[1]
PARAMS = load_params(REPO / "params.yaml")
CPU = EngineConfig(backend="hf", device="cpu", dtype="float32", batch_size=8, threads=1)


def row(qid: str, role: str, response: str, eos: bool = True, messages=None) -> dict:
    return {"system": "decor", "role": role, "question_id": qid, "turn": 0, "reward": 1.0, "response_tokens": 1,
            "messages": messages or [{"role": "user", "content": f"question {qid} for {role}"}],
            "response": response, "eos": eos}


def decor_rows(questions: int) -> list[dict]:
    """Valid outputs of DECOR's three policy roles (their listed longest outputs) for `questions` questions."""
    return [row(f"q{i}", r, D.LONGEST_OUTPUTS[r][0]) for i in range(questions) for r in D.POLICY_ROLES]


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def test_the_last_questions_are_the_probes_and_never_train():
    rows = decor_rows(5)
    train, held = split_heldout(rows, 2)
    assert {r["question_id"] for r in held} == {"q3", "q4"}
    assert {r["question_id"] for r in train} == {"q0", "q1", "q2"}
    assert len(train) + len(held) == len(rows)
    with pytest.raises(ValueError, match="raise warmup.questions"):
        split_heldout(rows, 5)


def test_each_role_keeps_at_most_its_share_in_trace_order():
    rows = [row("q0", "a", "x"), row("q0", "b", "x"), row("q1", "a", "y"), row("q2", "a", "z"), row("q2", "b", "z")]
    got = per_role(rows, 2)
    assert [(r["question_id"], r["role"]) for r in got] == [("q0", "a"), ("q0", "b"), ("q1", "a"), ("q2", "b")]


def test_sft_ids_are_the_engines_prompt_then_the_response_with_eos_only_where_the_trace_ended_on_it(tok, tiny_llama):
    from ragteam.llm.hf import HFEngine

    engine = HFEngine(str(tiny_llama), CPU)
    ended = row("q0", D.PLANNER, "<search>\nwho directed it\n</search>", eos=True)
    ids, mask = sft_ids(ended, tok)
    prompt = engine.encode(ended["messages"])           # what a rollout's engine feeds the policy
    assert ids[: len(prompt)] == prompt and mask[: len(prompt)] == [0] * len(prompt)
    target = tok(ended["response"], add_special_tokens=False).input_ids + [tok.eos_token_id]
    assert ids[len(prompt):] == target and mask[len(prompt):] == [1] * len(target)
    # a response that a stop string ended keeps it and gets no EOS: the engine stopped there, the turn goes on
    stopped = row("q0", "qagent", "<plan>x</plan><search>", eos=False)
    ids, mask = sft_ids(stopped, tok)
    assert ids[-1] != tok.eos_token_id
    assert sum(mask) == len(tok(stopped["response"], add_special_tokens=False).input_ids)
    # QAgent's later turns continue the assistant message: its <information> block is prompt, never a target
    turn2 = row("q0", "qagent", "<reflection>ok</reflection>", messages=[
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<search>x</search><information>doc</information>"}])
    ids, mask = sft_ids(turn2, tok)
    prompt = engine.encode(turn2["messages"])
    assert ids[: len(prompt)] == prompt and chat_text(tok, turn2["messages"]).endswith("</information>")
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == "<reflection>ok</reflection>" + tok.eos_token
    kept, dropped = tokenized_rows([ended, turn2], tok, max_length=len(ids))
    assert len(kept) == 2 and dropped == 0
    kept, dropped = tokenized_rows([ended, turn2], tok, max_length=len(ids) - 1)
    assert len(kept) == 1 and dropped == 1


def test_the_probe_parses_each_roles_output_with_its_own_parser(monkeypatch):
    system = oracle_system("decor", PARAMS)
    rows = decor_rows(2)
    probe = FormatProbe(system, rows, 1, {"default": SamplingConfig(max_new_tokens=8)}, CPU, "unused", None)
    assert probe.roles == sorted(D.POLICY_ROLES) and len(probe.rows) == 3        # one row per role
    assert all(s.temperature == 0 for s in probe.sampling.values())               # greedy, whatever the rollouts use
    gold = [r["response"] for r in probe.rows]
    monkeypatch.setattr(probe, "outputs", lambda model: gold)
    assert probe(None)["format_error_rate"] == 0.0
    # the degenerate outputs a policy could write: empty, a stub, an empty tag
    for bad in ("", "Answer:", "<search></search>"):
        outs = [bad if r["role"] == D.PLANNER else g for r, g in zip(probe.rows, gold)]
        monkeypatch.setattr(probe, "outputs", lambda model, outs=outs: outs)
        rates = probe(None)
        assert rates[f"format_error/{D.PLANNER}"] == 1.0, bad
        assert rates[f"format_error/{D.FILTER}"] == 0.0 and rates["format_error_rate"] == pytest.approx(1 / 3, abs=1e-4)


def _params(**kw) -> WarmupParams:
    base = {"heldout_questions": 1, "rows_per_role": 2, "probe_rows_per_role": 1, "probe_every": 1,
            "format_threshold": 0.2,
            "sft": {"steps": 3, "batch_size": 2, "lr": 1e-3, "max_length": 1024, "save_steps": 1,
                    "lora": {"enabled": True, "rank": 4, "alpha": 8, "top_layers": 1}}}
    return WarmupParams.model_validate({**base, **kw})


def test_warmup_probes_every_step_and_stops_at_the_threshold_or_the_cap(tiny_llama, tmp_path, monkeypatch):
    from ragteam.warmup import sft as W

    system = oracle_system("decor", PARAMS)
    sampling = {"default": SamplingConfig(max_new_tokens=4)}
    rates = iter([1.0, 0.5, 0.1, 0.0])      # what the probe measures before step 1 and after steps 1, 2, 3
    monkeypatch.setattr(W.FormatProbe, "__call__", lambda self, model: {"format_error_rate": next(rates)})
    res = W.train_warmup(system, decor_rows(4), str(tiny_llama), str(tmp_path / "a"), _params(), sampling, CPU)
    probes = [(h["step"], h["format_error_rate"]) for h in res.log_history if "format_error_rate" in h]
    assert probes == [(0, 1.0), (1, 0.5), (2, 0.1)]                   # 0.1 < 0.2: stopped after step 2
    assert res.global_step == 2 and res.extra["stopped_by"] == "threshold"
    assert res.extra["rows_per_role"] == {r: 2 for r in D.POLICY_ROLES}   # 3 training questions, 2 rows per role
    rates = iter([1.0, 0.9, 0.8, 0.7])
    res = W.train_warmup(system, decor_rows(4), str(tiny_llama), str(tmp_path / "b"), _params(), sampling, CPU)
    assert res.global_step == 3 and res.extra["stopped_by"] == "step cap"
    rates = iter([0.5, 0.1])                # no probe of the start model: the first probe follows step 1
    res = W.train_warmup(system, decor_rows(4), str(tiny_llama), str(tmp_path / "c"),
                         _params(probe_at_start=False, probe_every=2), sampling, CPU)
    probes = [(h["step"], h["format_error_rate"]) for h in res.log_history if "format_error_rate" in h]
    assert probes == [(2, 0.5), (3, 0.1)] and res.extra["stopped_by"] == "threshold"   # every 2, and at the cap


def test_no_probe_before_probe_from_but_always_one_at_the_cap(tiny_llama, tmp_path, monkeypatch):
    from ragteam.warmup import sft as W

    system = oracle_system("decor", PARAMS)
    sampling = {"default": SamplingConfig(max_new_tokens=4)}
    seen: list[int] = []
    monkeypatch.setattr(W.FormatProbe, "__call__", lambda self, model: seen.append(1) or {"format_error_rate": 1.0})
    res = W.train_warmup(system, decor_rows(4), str(tiny_llama), str(tmp_path / "a"),
                         _params(probe_at_start=False, probe_every=1, probe_from=3,
                                 sft={**_params().sft.model_dump(), "steps": 4}), sampling, CPU)
    probes = [h["step"] for h in res.log_history if "format_error_rate" in h]
    assert probes == [3, 4] and res.global_step == 4 and res.extra["stopped_by"] == "step cap"
    res = W.train_warmup(system, decor_rows(4), str(tiny_llama), str(tmp_path / "b"),
                         _params(probe_at_start=False, probe_every=2, probe_from=9), sampling, CPU)
    assert [h["step"] for h in res.log_history if "format_error_rate" in h] == [3]   # past the cap: the cap alone


def test_where_the_probe_runs_changes_when_training_stops_never_what_a_step_learns(tiny_llama, tmp_path):
    """The real probe (greedy decoding with the trainer's model, in eval mode) after every step, against none
    before the cap: the same weights after the same steps, so `probe_from` only saves the probes' time."""
    import torch

    from ragteam.warmup import sft as W

    system = oracle_system("decor", PARAMS)
    sampling = {"default": SamplingConfig(max_new_tokens=6)}
    runs = {}
    for name, kw in {"every_step": {"probe_every": 1}, "cap_only": {"probe_every": 1, "probe_from": 99}}.items():
        res = W.train_warmup(system, decor_rows(4), str(tiny_llama), str(tmp_path / name),
                             _params(format_threshold=0.0, **kw), sampling, CPU)    # 0: never below, to the cap
        assert res.global_step == 3 and res.extra["stopped_by"] == "step cap"
        runs[name] = ([h["step"] for h in res.log_history if "format_error_rate" in h],
                      {k: v.detach().clone() for k, v in res.model.named_parameters() if "lora" in k})
    assert runs["every_step"][0] == [0, 1, 2, 3] and runs["cap_only"][0] == [0, 3]
    assert runs["cap_only"][1] and runs["every_step"][1].keys() == runs["cap_only"][1].keys()
    for k, v in runs["every_step"][1].items():
        assert torch.equal(v, runs["cap_only"][1][k]), k


def test_every_role_stops_only_when_no_role_is_left_above_the_threshold():
    """DECOR's lock run: the Filter failed half its probe rows while the mean over roles was 17 %; the mean rule
    stopped there, the per-role rule does not."""
    filter_bad = {"format_error_rate": 0.1667, f"format_error/{D.PLANNER}": 0.0, f"format_error/{D.FILTER}": 0.5,
                  f"format_error/{D.ANSWERER}": 0.0}
    clean = {**filter_bad, "format_error_rate": 0.0, f"format_error/{D.FILTER}": 0.0}
    mean, every = _params(), _params(stop_when="every_role")
    assert mean.below_threshold(filter_bad) and not every.below_threshold(filter_bad)
    assert mean.below_threshold(clean) and every.below_threshold(clean)
    # exactly at the threshold is not below it, and a probe without per-role rates never ends an every_role run
    assert not every.below_threshold({**clean, f"format_error/{D.FILTER}": 0.2})
    assert not every.below_threshold({"format_error_rate": 0.0})
    # the rollout probe: every role's call rate below it, but a third of the questions hold a malformed call (one bad
    # Filter call in each of 4 of 12 questions, among many good ones): every_role does not stop there, nor mean
    roles_clean_questions_not = {**clean, "format_error_rate": 0.3333, f"format_error/{D.FILTER}": 0.1}
    r_mean, r_every = _params(probe="rollout"), _params(probe="rollout", stop_when="every_role")
    assert not r_every.below_threshold(roles_clean_questions_not) and not r_mean.below_threshold(
        roles_clean_questions_not)
    assert r_every.below_threshold(clean) and r_mean.below_threshold(filter_bad)


def test_the_warmup_under_every_role_trains_on_while_one_role_still_fails(tiny_llama, tmp_path, monkeypatch):
    from ragteam.warmup import sft as W

    system = oracle_system("decor", PARAMS)
    roles = [f"format_error/{r}" for r in D.POLICY_ROLES]
    # before step 1, after steps 1, 2, 3: the mean is below 0.2 from step 1, the last role clears at step 3
    seq = iter([[1.0, 1.0, 1.0], [0.0, 0.5, 0.0], [0.0, 0.25, 0.0], [0.0, 0.0, 0.0]])

    def probe(self, model):
        rates = next(seq)
        return {"format_error_rate": sum(rates) / 3, **dict(zip(roles, rates))}

    monkeypatch.setattr(W.FormatProbe, "__call__", probe)
    res = W.train_warmup(system, decor_rows(4), str(tiny_llama), str(tmp_path / "a"),
                         _params(stop_when="every_role"), {"default": SamplingConfig(max_new_tokens=4)}, CPU)
    assert res.global_step == 3 and res.extra["stopped_by"] == "threshold"
    assert W.stopped_at_threshold(tmp_path / "a" / "checkpoint-3", _params(stop_when="every_role").below_threshold)
    assert not W.stopped_at_threshold(tmp_path / "a" / "checkpoint-2", _params(stop_when="every_role").below_threshold)


def test_per_system_overrides_merge_key_by_key_and_bad_ones_are_named():
    from ragteam.config import ParamsError, parse_section
    from ragteam.systems.warmup import WarmupSection

    section = {**PARAMS["warmup"], "systems": {"decor": {"stop_when": "every_role", "sft": {"steps": 48}}}}
    wp = parse_section({"warmup": section}, "warmup", WarmupParams)
    decor, mask = wp.for_system("decor"), wp.for_system("mask")
    assert decor.stop_when == "every_role" and decor.sft.steps == 48
    assert decor.sft.lr == wp.sft.lr and decor.format_threshold == wp.format_threshold   # the rest is shared
    assert mask == wp and mask.stop_when == PARAMS["warmup"].get("stop_when", "mean")
    bad = [({"nosuch": {"stop_when": "every_role"}}, "no joint system 'nosuch'"),
           ({"decor": {"questions": 10}}, "systems.decor.questions: not overridable"),
           ({"decor": {"systems": {}}}, "systems.decor.systems: not overridable")]
    for systems, msg in bad:
        with pytest.raises(ParamsError, match=msg):
            parse_section({"warmup": {**section, "systems": systems}}, "warmup", WarmupSection)
    wp = parse_section({"warmup": {**section, "systems": {"decor": {"stop_when": "max"}}}}, "warmup", WarmupParams)
    with pytest.raises(ParamsError, match=r"systems\.decor\.stop_when: Input should be .mean. or .every_role."):
        wp.for_system("decor")


def test_the_real_probe_runs_the_trainers_model_and_leaves_it_training(tiny_llama):
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragteam.train.common import LoraParams, lora_config

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_llama),
                           lora_config(LoraParams(enabled=True, rank=4, alpha=8), str(tiny_llama)))
    model.train()
    probe = FormatProbe(oracle_system("decor", PARAMS), decor_rows(1), 1,
                        {"default": SamplingConfig(max_new_tokens=6)}, CPU, str(tiny_llama),
                        AutoTokenizer.from_pretrained(tiny_llama))
    rates = probe(model)
    assert rates["format_error_rate"] == 1.0          # a random 2-layer model writes no DECOR block
    assert set(rates) == {"format_error_rate", *(f"format_error/{r}" for r in D.POLICY_ROLES)}
    assert model.training


def test_a_system_starts_from_its_warmup_or_from_the_backbone_where_it_was_off(tmp_path):
    on, off, none = tmp_path / "mask", tmp_path / "jade", tmp_path / "decor"
    on.mkdir(), off.mkdir(), none.mkdir()
    (on / "config.json").write_text("{}")
    (off / WARMUP_OFF).write_text(json.dumps({"enabled": False}))
    assert start_model(on, "models/llm") == str(on)
    assert start_model(off, "models/llm") == "models/llm"
    with pytest.raises(DataError, match="warmup_joint@decor"):
        start_model(none, "models/llm")


def test_a_warmup_row_whose_warmup_was_off_is_the_base_model(tmp_path):
    off = tmp_path / "mask"
    off.mkdir()
    (off / WARMUP_OFF).write_text(json.dumps({"enabled": False}))

    class Pool:
        def team(self, role_models, base, sampling):
            return role_models, base

    got, base = make_team(Pool(), SystemSpec(workflow="mask", model=str(off)), {}, "models/llm", {})
    assert set(got.values()) == {"models/llm"} and base == "models/llm"
    got, _ = make_team(Pool(), SystemSpec(workflow="mask", model="models/agents/mask"), {}, "models/llm", {})
    assert set(got.values()) == {"models/agents/mask"}


def test_reports_compare_the_warmup_with_the_base_and_rl_with_the_warmup():
    systems = {n: SystemSpec(workflow="mask") for n in ("mask", "mask_warmup", "mask_trained")}
    pairs = comparison_pairs(systems)
    assert ("mask_trained", "mask") in pairs and ("mask_warmup", "mask") in pairs
    assert ("mask_trained", "mask_warmup") in pairs


def test_the_default_profile_warms_every_joint_system_up_and_the_paper_profile_does_not():
    from ragteam.config import deep_merge
    from ragteam.profiles import check_keys, load_profile

    assert WarmupParams.model_validate(PARAMS["warmup"]).enabled
    for s in PARAMS["joint"]["systems"]:
        assert PARAMS["eval"]["systems"][f"{s}_warmup"]["model"] == f"models/warmup/{s}"
    overlay = load_profile("paper", REPO / "profiles")
    check_keys(PARAMS, overlay)
    assert WarmupParams.model_validate(deep_merge(PARAMS, overlay)["warmup"]).enabled is False


def test_stage_with_the_warmup_off_trains_nothing_and_train_joint_starts_from_the_backbone(tmp_path, monkeypatch):
    from stages import warmup_joint

    monkeypatch.chdir(tmp_path)
    params = {**PARAMS, "warmup": {**PARAMS["warmup"], "enabled": False}}
    assert warmup_joint.run("mask", params) == {"enabled": False}
    out = tmp_path / "models/warmup/mask"
    assert [p.name for p in out.iterdir()] == [WARMUP_OFF]
    assert start_model(out, PARAMS["llm"]["model"]) == PARAMS["llm"]["model"]


def test_stages_name_the_missing_input_and_the_stage_that_makes_it(tmp_path, monkeypatch):
    from ragteam.config import ParamsError
    from stages import oracle_traces, warmup_joint

    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match="run stage prepare_data"):
        oracle_traces.run("mask", PARAMS)
    with pytest.raises(ParamsError, match="warmup.questions"):
        oracle_traces.run("mask", {**PARAMS, "warmup": {**PARAMS["warmup"], "questions": -1}})
    with pytest.raises(DataError, match="run stage oracle_traces@mask"):
        warmup_joint.run("mask", PARAMS)


def test_the_probe_generates_with_what_the_workflow_adds_to_a_roles_sampling():
    from ragteam.systems.qagent import roles as Q

    system = oracle_system("qagent", PARAMS)
    probe = FormatProbe(system, [row("q0", "qagent", "<answer>x</answer>", eos=False)], 1,
                        {"qagent": SamplingConfig(max_new_tokens=104, temperature=1.0)}, CPU, "unused", None)
    s = probe.sampling["qagent"]
    assert set(Q.STOP_STRINGS) <= set(s.stop) and s.temperature == 0 and s.max_new_tokens == 104


def test_a_rerun_of_a_warmup_that_stopped_at_the_threshold_loads_it_and_trains_no_further(tiny_llama, tmp_path,
                                                                                          monkeypatch):
    import torch

    from ragteam.warmup import sft as W

    system = oracle_system("decor", PARAMS)
    sampling = {"default": SamplingConfig(max_new_tokens=4)}
    rates = iter([1.0, 0.5, 0.1])
    monkeypatch.setattr(W.FormatProbe, "__call__", lambda self, model: {"format_error_rate": next(rates)})
    first = W.train_warmup(system, decor_rows(4), str(tiny_llama), str(tmp_path), _params(), sampling, CPU)
    assert first.global_step == 2 and W.stopped_at_threshold(tmp_path / "checkpoint-2", _params().below_threshold)
    weights = {k: v.detach().clone() for k, v in first.model.named_parameters() if "lora" in k}

    def no_probe(self, model):
        raise AssertionError("a finished warm-up must not train or probe again")

    monkeypatch.setattr(W.FormatProbe, "__call__", no_probe)
    again = W.train_warmup(system, decor_rows(4), str(tiny_llama), str(tmp_path), _params(), sampling, CPU)
    assert again.global_step == 2 and again.resumed_from == 2 and again.extra["stopped_by"] == "threshold"
    for k, v in again.model.named_parameters():
        if "lora" in k:
            assert torch.equal(v, weights[k]), k


def test_a_rerun_of_a_warmup_that_reached_its_step_cap_loads_it_and_trains_no_further(tiny_llama, tmp_path,
                                                                                     monkeypatch):
    """transformers' Trainer, resumed from the checkpoint at max_steps, trains one step past it (a DVC rerun of
    warmup_joint@mask with its checkpoints still there made a 97-step warm-up of a 96-step cap): the finished run is
    loaded instead, with its weights, history and step."""
    import torch

    from ragteam.warmup import sft as W

    system = oracle_system("decor", PARAMS)
    sampling = {"default": SamplingConfig(max_new_tokens=4)}
    monkeypatch.setattr(W.FormatProbe, "__call__", lambda self, model: {"format_error_rate": 1.0})
    params = _params(sft={**_params().sft.model_dump(), "steps": 2})
    first = W.train_warmup(system, decor_rows(4), str(tiny_llama), str(tmp_path), params, sampling, CPU)
    assert first.global_step == 2 and first.extra["stopped_by"] == "step cap"
    weights = {k: v.detach().clone() for k, v in first.model.named_parameters() if "lora" in k}

    def no_probe(self, model):
        raise AssertionError("a finished warm-up must not train or probe again")

    monkeypatch.setattr(W.FormatProbe, "__call__", no_probe)
    again = W.train_warmup(system, decor_rows(4), str(tiny_llama), str(tmp_path), params, sampling, CPU)
    assert again.global_step == 2 and again.resumed_from == 2 and again.seconds == 0.0
    # the checkpoint's history is the run's but its closing summary (train_runtime, logged after the last save)
    assert again.extra["stopped_by"] == "step cap"
    assert again.log_history == [h for h in first.log_history if "train_runtime" not in h]
    assert max(h.get("step", 0) for h in again.log_history) == 2
    for k, v in again.model.named_parameters():
        if "lora" in k:
            assert torch.equal(v, weights[k]), k


def test_a_full_checkpoint_loads_only_when_it_fits_the_model(tiny_llama, tmp_path):
    """A full-weight warm-up checkpoint is reloaded with its weights, and one holding a key the model lacks, or
    lacking one it needs (other than a tied output layer), is an error naming the checkpoint, not a silent skip."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from ragteam.warmup.sft import load_checkpoint

    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    tied = model.config.tie_word_embeddings
    sd = {k: v.clone().contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    sd["model.norm.weight"] += 1.0

    def ckpt(name, weights):
        (tmp_path / name).mkdir()
        save_file(weights, str(tmp_path / name / "model.safetensors"))
        return tmp_path / name

    fresh = AutoModelForCausalLM.from_pretrained(tiny_llama)
    load_checkpoint(fresh, ckpt("ok", sd))
    assert torch.equal(fresh.state_dict()["model.norm.weight"], sd["model.norm.weight"])
    with pytest.raises(ValueError, match="unexpected.*extra.weight"):
        load_checkpoint(fresh, ckpt("extra", {**sd, "extra.weight": torch.zeros(2)}))
    with pytest.raises(ValueError, match="missing.*model.norm.weight"):
        load_checkpoint(fresh, ckpt("short", {k: v for k, v in sd.items() if k != "model.norm.weight"}))


# ---- the rollout probe (warmup.probe: rollout): the policy's own trajectories on held-out questions ----------------

def _episode(qid: str, calls: list[tuple[str, str | None]], answer: str | None):
    from ragteam.records import AgentCall, Episode

    ep = Episode(question_id=qid, question=f"question {qid}", golden_answers=["Paris"], final_answer=answer)
    for role, error in calls:
        ep.add_call(AgentCall(role=role, prompt=[], response=f"{role} output", format_error=error))
    return ep


def test_rollout_rates_count_questions_with_a_malformed_policy_call_and_each_roles_calls():
    from ragteam.metrics import has_answer
    from ragteam.warmup.sft import rollout_rates

    P, F, A, S = D.PLANNER, D.FILTER, D.ANSWERER, D.SUMMARIZER
    eps = [_episode("q0", [(P, None), (F, None), (S, None), (A, None)], "Paris"),          # clean, answered
           _episode("q1", [(P, None), (F, "an empty <filter> tag"), (A, None)], "Paris"),  # one bad Filter call
           _episode("q2", [(P, None), (F, None), (S, "no summary"), (A, None)], "Lyon"),   # frozen role: not counted
           _episode("q3", [(P, "no block")], None)]                                         # a stub: no answer
    probe = type("P", (), {})()
    rates = rollout_rates(eps, D.POLICY_ROLES, has_answer, probe)
    # by hand: q1 and q3 have a malformed policy call (2 of 4); the summarizer's error in q2 is the frozen model's
    assert rates["format_error_rate"] == 0.5
    assert rates[f"format_error/{P}"] == 0.25          # 1 of 4 Planner calls
    assert rates[f"format_error/{F}"] == pytest.approx(1 / 3, abs=1e-4)   # 1 of 3 Filter calls
    assert rates[f"format_error/{A}"] == 0.0 and f"format_error/{S}" not in rates
    assert rates["no_answer_rate"] == 0.25
    assert probe.failures == {P: ("no block", f"{P} output"), F: ("an empty <filter> tag", f"{F} output")}
    # the degenerate answers: empty, whitespace, None are no answer
    eps = [_episode(f"q{i}", [(A, None)], a) for i, a in enumerate(["", "  ", None, "Paris"])]
    assert rollout_rates(eps, D.POLICY_ROLES, has_answer)["no_answer_rate"] == 0.75
    with pytest.raises(ValueError, match="no episode"):
        rollout_rates([], D.POLICY_ROLES, has_answer)


def test_the_rollout_probe_questions_are_the_held_out_traces_pool_rows():
    from ragteam.warmup.sft import heldout_questions

    traces = decor_rows(4)
    pool = {f"q{i}": {"id": f"q{i}", "question": f"question q{i}", "golden_answers": ["x"]} for i in range(4)}
    assert [q["id"] for q in heldout_questions(traces, 2, pool)] == ["q2", "q3"]
    del pool["q3"]
    with pytest.raises(ValueError, match="q3 of the traces are not in the training pool"):
        heldout_questions(traces, 2, pool)


def test_the_rollout_probe_runs_the_workflow_with_the_trainers_model_and_frozen_roles_on_the_start_model(tiny_llama):
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from helpers_agents import KeywordRetriever
    from ragteam.train.common import LoraParams, lora_config
    from ragteam.warmup.sft import RolloutProbe

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_llama),
                           lora_config(LoraParams(enabled=True, rank=4, alpha=8), str(tiny_llama)))
    model.train()
    params = {**PARAMS, "decor": {**PARAMS["decor"], "t_max": 1}}
    questions = [{"id": "q0", "question": "Where is the Louvre?", "golden_answers": ["Paris"]}]
    retriever = KeywordRetriever([("Louvre", "The Louvre is in Paris.")])
    probe = RolloutProbe(oracle_system("decor", params), questions, retriever,
                         {"default": SamplingConfig(max_new_tokens=6, temperature=1.0)}, CPU, str(tiny_llama),
                         AutoTokenizer.from_pretrained(tiny_llama))
    assert all(s.temperature == 0 for s in probe.sampling.values())    # greedy, whatever the rollouts sample at
    eps = probe.episodes(model)
    assert len(eps) == 1 and eps[0].calls and model.training
    rates = probe(model)
    assert rates["format_error_rate"] == 1.0 and rates["no_answer_rate"] == 1.0   # a random model writes no block
    assert set(rates) >= {"format_error_rate", "no_answer_rate", f"format_error/{D.PLANNER}"}
    assert probe.roles == sorted(D.POLICY_ROLES)


def test_warmup_with_the_rollout_probe_stops_on_its_rates_and_needs_the_pool_and_retriever(tiny_llama, tmp_path,
                                                                                          monkeypatch):
    from ragteam.warmup import sft as W

    system = oracle_system("decor", PARAMS)
    sampling = {"default": SamplingConfig(max_new_tokens=4)}
    pool = {f"q{i}": {"id": f"q{i}", "question": f"question q{i}", "golden_answers": ["x"]} for i in range(4)}
    seen = []
    rates = iter([0.9, 0.1])

    def fake(self, model):
        seen.append([q["id"] for q in self.questions])
        return {"format_error_rate": next(rates), "no_answer_rate": 0.0}

    monkeypatch.setattr(W.RolloutProbe, "__call__", fake)
    p = _params(probe="rollout", probe_at_start=False)
    with pytest.raises(ValueError, match="needs the training pool and the retriever"):
        W.train_warmup(system, decor_rows(4), str(tiny_llama), str(tmp_path / "x"), p, sampling, CPU)
    res = W.train_warmup(system, decor_rows(4), str(tiny_llama), str(tmp_path / "a"), p, sampling, CPU,
                         pool=pool, retriever=object())
    assert seen == [["q3"], ["q3"]]                  # the held-out question, never a trained one
    assert res.global_step == 2 and res.extra["stopped_by"] == "threshold"
    assert res.extra["probe"] == "rollout" and res.extra["probe_questions"] == 1 and res.extra["probe_rows"] == 0
    # the probe's kind is part of the run's identity: a rows-probe checkpoint is not resumed as a rollout one
    rows_run = W.train_warmup(system, decor_rows(4), str(tiny_llama), str(tmp_path / "b"),
                              _params(probe_at_start=False), sampling, CPU)
    assert rows_run.extra["fingerprint"] != res.extra["fingerprint"]


def test_the_rollout_probe_sends_policy_roles_to_the_trainers_model_and_frozen_roles_to_the_start_model(
        tiny_llama):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragteam.warmup.sft import RolloutProbe

    import dataclasses

    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    seen = {}

    def run(rows, team, retriever):
        seen.update({role: team.engine(role) for role in (D.PLANNER, D.FILTER, D.SUMMARIZER)})
        return []

    system = dataclasses.replace(oracle_system("decor", PARAMS), run=run)
    probe = RolloutProbe(system, [{"id": "q0", "question": "q", "golden_answers": ["x"]}], object(),
                         {"default": SamplingConfig(max_new_tokens=4)}, CPU.model_copy(update={"backend": "vllm"}),
                         str(tiny_llama), AutoTokenizer.from_pretrained(tiny_llama))
    probe.episodes(model)     # llm.backend vllm: the warm-up's probe still generates on HF, in this process
    # the trainer's weights, through the live policy engine (ragteam.llm.policy) over the very model being trained
    assert seen[D.PLANNER] is seen[D.FILTER] and seen[D.PLANNER].engine.model is model
    assert seen[D.SUMMARIZER] is not seen[D.PLANNER] and seen[D.SUMMARIZER].model is not model
    frozen = seen[D.SUMMARIZER]
    assert type(frozen).__name__ == "HFEngine"
    probe.episodes(model)
    assert seen[D.SUMMARIZER] is frozen                                                # loaded once


def test_the_rollout_probe_keeps_the_prefix_cache_inside_one_probe_and_answers_as_without_it(tiny_llama):
    """llm.prefix_cache_tokens is on in the probe: each probe builds a fresh policy engine, so its cache never holds
    KV from weights a later optimiser step changed, and the greedy trajectories equal those without a cache."""
    import dataclasses

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from helpers_agents import KeywordRetriever
    from ragteam.warmup.sft import RolloutProbe

    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    params = {**PARAMS, "decor": {**PARAMS["decor"], "t_max": 1}}
    questions = [{"id": f"q{i}", "question": f"Where is the Louvre {i}?", "golden_answers": ["Paris"]}
                 for i in range(3)]
    retriever = KeywordRetriever([("Louvre", "The Louvre is in Paris.")])
    system = oracle_system("decor", params)
    engines = []

    def run(rows, team, r):
        engines.append(team.engine(D.PLANNER))
        return system.run(rows, team, r)

    def probe(cache: int) -> RolloutProbe:
        return RolloutProbe(dataclasses.replace(system, run=run), questions, retriever,
                            {"default": SamplingConfig(max_new_tokens=6)},
                            CPU.model_copy(update={"prefix_cache_tokens": cache}), str(tiny_llama),
                            AutoTokenizer.from_pretrained(tiny_llama))

    cached, plain = probe(4096), probe(0)
    assert cached.cfg.prefix_cache_tokens == 4096
    answers = [[c.response for c in ep.calls] for ep in cached.episodes(model)]
    hf = engines[-1].engine                                # the live policy engine's HFEngine
    assert hf.prefix_cache_tokens == 4096 and hf._prefix_cache                     # the cache was used
    assert answers == [[c.response for c in ep.calls] for ep in plain.episodes(model)]
    first = engines[0]
    with torch.no_grad():                                  # an optimiser step between two probes
        for w in model.parameters():
            w.add_(0.05 * torch.randn_like(w))
    changed = [[c.response for c in ep.calls] for ep in cached.episodes(model)]
    assert engines[-1] is not first and engines[-1].engine.model is model   # a fresh engine: a fresh cache
    engines.clear()
    assert changed == [[c.response for c in ep.calls] for ep in plain.episodes(model)]
