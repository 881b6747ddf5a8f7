"""OpenRLHF backend: the generated reward file scores like the TRL path; datasets and commands carry the right keys
and flags. (The cluster path itself, Ray + DeepSpeed + vLLM on GPUs, is not executed here.)"""
import importlib.util
import json
import shlex
from pathlib import Path

import pytest

from ragteam.io import load_jsonl
from ragteam.rewards.maps import AnswerReward
from ragteam.train.grpo import GRPOParams, answer_reward_func
from ragteam.train.openrlhf import (
    OpenRLHFCluster,
    decode_query_label,
    openrlhf_query_rewards,
    prepare_answer_grpo_job,
    prepare_query_grpo_job,
    prepare_sft_job,
    response_from_query,
    submit,
)
from ragteam.train.sft import SFTParams

REPO = Path(__file__).resolve().parents[1]
CLUSTER = OpenRLHFCluster(project_dir="/cluster/ragteam", gpus_per_node=2, vllm_engines=2)
# MAPS Section 4.1: 16 rollouts per sample, train batch 512, rollout batch 32, lr 1e-6, KL 1e-4
PAPER = GRPOParams(steps=575, prompts_per_step=32, num_generations=16, micro_batch_size=4, lr=1e-6, kl_beta=1e-4,
                   temperature=1.0, max_completion_length=64, save_steps=50, lr_scheduler="constant",
                   gradient_checkpointing=True)
SAMPLES = [
    {"id": "q1", "prompt": [{"role": "system", "content": "Answer the question based on the given document."},
                            {"role": "user", "content": "Doc: Paris is the capital of France.\nQuestion: Capital of "
                                                        "France?"}],
     "golden_answers": ["Paris", "Paris, France"]},
    {"id": "q2", "prompt": [{"role": "user", "content": "Doc: The Eiffel Tower is in Paris.\nQuestion: Which tower "
                                                        "is in Paris?"}],
     "golden_answers": ["Eiffel Tower"]},
]


def _value(cmd: list[str], flag: str) -> str:
    assert cmd.count(flag) == 1, f"{flag} appears {cmd.count(flag)} times"
    return cmd[cmd.index(flag) + 1]


def _load_reward_module(path):
    # exactly how OpenRLHF loads --reward.remote_url files
    spec = importlib.util.spec_from_file_location("reward_func", str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def completions(smollm2_dir):
    """(tokenizer, {sample id: [response token ids]}): real SmolLM2 samples plus hand-written answers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    torch.manual_seed(0)
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    out = {}
    for s in SAMPLES:
        ids = tok.apply_chat_template(s["prompt"], add_generation_prompt=True, return_dict=True)["input_ids"]
        gen = model.generate(torch.tensor([ids] * 2), max_new_tokens=8, do_sample=True, top_k=0,
                             pad_token_id=tok.pad_token_id)
        written = [tok(t, add_special_tokens=False)["input_ids"] + [eot]
                   for t in ("Paris", " The Eiffel Tower.", "It is the city of Paris, France", "")]
        out[s["id"]] = [g[len(ids):].tolist() for g in gen] + written
    return tok, out


@pytest.mark.slow
@pytest.mark.parametrize("stage,min_words", [("stage1", 0), ("stage2", 1)])
def test_generated_reward_file_matches_the_trl_reward(stage, min_words, completions, tmp_path):
    import torch

    tok, responses = completions
    job = prepare_answer_grpo_job(SAMPLES, tmp_path / "job", model_path="/m", output_dir="/out", params=PAPER,
                                  reward=AnswerReward(stage, 0.5, 3, min_words),
                                  special_tokens=tok.all_special_tokens,
                                  cluster=CLUSTER.model_copy(update={"project_dir": str(REPO)}))
    text = job.reward_file.read_text()
    assert f"'stage': '{stage}'" in text and "'alpha': 0.5" in text and "'max_words': 3" in text
    assert f"'min_words': {min_words}" in text
    reward_func = _load_reward_module(job.reward_file).reward_func

    trl_reward = answer_reward_func(AnswerReward(stage, 0.5, 3, min_words))
    scored = []
    for row in load_jsonl(job.dataset):
        prompt_ids = tok.apply_chat_template(row["input"], add_generation_prompt=True, return_dict=True)["input_ids"]
        prompt = tok.apply_chat_template(row["input"], add_generation_prompt=True, tokenize=False)
        for resp in responses[row["id"]]:
            # OpenRLHF: one sample per call; query = prompt + response decoded together with special tokens
            out = reward_func([tok.decode(prompt_ids + resp, skip_special_tokens=False)], [prompt], [row["label"]])
            assert set(out) == {"rewards", "scores", "extra_logs"}
            assert isinstance(out["rewards"], torch.Tensor) and out["rewards"].shape == (1,)
            # TRL: conversational completion decoded without special tokens, golden answers from the column
            completion = [{"role": "assistant", "content": tok.decode(resp, skip_special_tokens=True)}]
            expected = trl_reward(completions=[completion], golden_answers=[json.loads(row["label"])])[0]
            assert out["rewards"].item() == pytest.approx(expected, abs=1e-6)
            assert out["scores"].item() in (0.0, 1.0)
            scored.append(expected)
    assert max(scored) == pytest.approx(1.5)  # "Paris" for q1 is exact: EM 1 + 0.5 * 1
    assert min(scored) == -1.0                 # the 8-word answer (and, with min_words 1, "") pay L(y)
    assert len(scored) == 12


def test_paper_profile_command_has_the_paper_values(tmp_path):
    job = prepare_answer_grpo_job(SAMPLES * 10, tmp_path / "job", model_path="/models/llama-3.1-8b-instruct",
                                  output_dir="/models/answer_agent_stage1", params=PAPER, reward=AnswerReward("stage1", 0.5, 12), special_tokens=["<|eot_id|>"], cluster=CLUSTER)
    cmd = job.command
    assert cmd[:4] == ["ray", "job", "submit", "--address"]
    sep = cmd.index("--")
    assert cmd[sep + 1:sep + 4] == ["python3", "-m", "openrlhf.cli.train_ppo_ray"]
    env = json.loads(_value(cmd, "--runtime-env-json"))
    assert env["env_vars"]["PYTHONPATH"] == "/cluster/ragteam"
    assert _value(cmd, "--actor.model_name_or_path") == "/models/llama-3.1-8b-instruct"
    assert _value(cmd, "--algo.advantage.estimator") == "group_norm"
    assert _value(cmd, "--rollout.n_samples_per_prompt") == "16"
    assert float(_value(cmd, "--actor.adam.lr")) == 1e-6
    assert float(_value(cmd, "--algo.kl.init_coef")) == 1e-4 and "--algo.kl.use_loss" in cmd
    assert _value(cmd, "--train.batch_size") == "512"
    assert _value(cmd, "--rollout.batch_size") == "32"
    assert _value(cmd, "--rollout.max_new_tokens") == "64"
    assert _value(cmd, "--reward.remote_url") == str(job.reward_file)
    assert _value(cmd, "--data.prompt_dataset") == str(job.dataset)
    assert _value(cmd, "--data.input_key") == "input" and _value(cmd, "--data.label_key") == "label"
    assert "--data.apply_chat_template" in cmd and "--ckpt.load_enable" in cmd and "--ckpt.save_hf" in cmd
    assert _value(cmd, "--ckpt.output_dir") == "/models/answer_agent_stage1"
    assert "--train.colocate_all" in cmd and _value(cmd, "--vllm.num_engines") == "2"
    # 575 steps x 32 prompts over 20 prompts -> 920 episodes of the whole (tiny) dataset
    assert _value(cmd, "--train.num_episodes") == str(-(-575 * 32 // 20))
    # v0.10.2+ names only: none of the removed underscore flags
    old = {"--pretrain", "--remote_rm_url", "--advantage_estimator", "--n_samples_per_prompt", "--init_kl_coef",
           "--use_kl_loss", "--prompt_data", "--input_key", "--label_key", "--actor_learning_rate",
           "--rollout_batch_size", "--train_batch_size", "--generate_max_len", "--prompt_max_len"}
    assert not old & set(cmd)
    flags = [a for a in cmd[sep + 4:] if a.startswith("--")]
    assert all("." in f for f in flags), [f for f in flags if "." not in f]
    # the dry run is the same command, shell-quoted, and is also written next to the data
    assert shlex.split(job.dry_run()) == cmd
    assert shlex.split((tmp_path / "job" / "command.sh").read_text().splitlines()[1]) == cmd


def test_prompt_dataset_rows_hold_messages_and_json_golden_answers(tmp_path):
    job = prepare_answer_grpo_job(SAMPLES, tmp_path / "j", model_path="/m", output_dir="/o", params=PAPER,
                                  reward=AnswerReward("stage2", 0.3, 12), special_tokens=[], cluster=CLUSTER)
    rows = load_jsonl(job.dataset)
    assert [r["id"] for r in rows] == ["q1", "q2"]
    assert rows[0]["input"] == SAMPLES[0]["prompt"]
    assert isinstance(rows[0]["label"], str) and json.loads(rows[0]["label"]) == ["Paris", "Paris, France"]
    assert rows[1]["datasource"] == "answer_agent_stage2"
    # a few steps over many prompts: one episode, only the prompts needed
    small = PAPER.model_copy(update={"steps": 1, "prompts_per_step": 1})
    job = prepare_answer_grpo_job(SAMPLES, tmp_path / "k", model_path="/m", output_dir="/o", params=small,
                                  reward=AnswerReward("stage1", 0.3, 12), special_tokens=[], cluster=CLUSTER)
    assert _value(job.command, "--data.max_samples") == "1" and _value(job.command, "--train.num_episodes") == "1"


def test_sft_job_for_the_judge(tmp_path, capsys):
    samples = [{"id": "j1", "prompt": SAMPLES[0]["prompt"], "completion": "Sufficient Information"}]
    params = SFTParams(batch_size=4, grad_accum=8, lr=5e-6, max_length=2048, save_steps=100, epochs=2)
    job = prepare_sft_job(samples, tmp_path / "sft", model_path="/m", output_dir="/models/judge", params=params,
                          cluster=CLUSTER)
    cmd = job.command
    assert cmd[:5] == ["deepspeed", "--num_gpus", "2", "--module", "openrlhf.cli.train_sft"]
    assert _value(cmd, "--data.input_key") == "input" and _value(cmd, "--data.output_key") == "output"
    assert "--data.apply_chat_template" in cmd
    assert _value(cmd, "--train.batch_size") == "32" and _value(cmd, "--train.max_epochs") == "2"
    assert float(_value(cmd, "--adam.lr")) == 5e-6
    row = load_jsonl(job.dataset)[0]
    # OpenRLHF renders input + output with the chat template; the loss covers the output turn only
    assert row["input"] == SAMPLES[0]["prompt"]
    assert row["output"] == [{"role": "assistant", "content": "Sufficient Information"}]
    assert submit(job, dry_run=True) == job.dry_run() and job.dry_run() in capsys.readouterr().out


def test_invalid_setups_fail_with_a_clear_message(tmp_path):
    with pytest.raises(ValueError, match="colocate_all"):
        prepare_answer_grpo_job(SAMPLES, tmp_path / "a", model_path="/m", output_dir="/o", params=PAPER,
                                reward=AnswerReward("stage1", 0.5, 12), special_tokens=[],
                                cluster=CLUSTER.model_copy(update={"vllm_engines": 1}))
    lora_top = PAPER.model_copy(update={"lora": PAPER.lora.model_copy(update={"enabled": True, "top_layers": 4})})
    with pytest.raises(ValueError, match="top_layers"):
        prepare_answer_grpo_job(SAMPLES, tmp_path / "b", model_path="/m", output_dir="/o", params=lora_top,
                                reward=AnswerReward("stage1", 0.5, 12), special_tokens=[], cluster=CLUSTER)
    with pytest.raises(ValueError, match=r"training sample 0 \(id='bad'\)"):
        prepare_answer_grpo_job([{"id": "bad", "prompt": [], "golden_answers": ["x"]}], tmp_path / "c",
                                model_path="/m", output_dir="/o", params=PAPER, reward=AnswerReward("stage1", 0.5, 12), special_tokens=[], cluster=CLUSTER)
    with pytest.raises(ValueError, match="project_dir"):
        OpenRLHFCluster()


def test_response_from_query_strips_the_prompt_and_special_tokens():
    prompt = "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n"
    specials = ["<|im_end|>", "<|im_start|>", "<|endoftext|>"]
    assert response_from_query(prompt + " Paris<|im_end|><|endoftext|>", prompt, specials) == "Paris"
    # decode(prompt_ids) differing from the prompt text (e.g. a BOS the template does not print): cut after the
    # prompt's last line instead
    assert response_from_query("<s>" + prompt + "Paris<|im_end|>", prompt, specials) == "Paris"


# ---- the query agent: R_q = ΔF1 (MAPS Eq. 7) ---------------------------------------------------------------------

PASSAGES = [("France", "Paris is the capital of France."), ("Lyon", "Lyon is a large city in France."),
            ("Berlin", "Berlin is the capital of Germany.")]
QUESTION = "What is the capital of France?"
QUERY_CONFIG = dict(answer_model="/models/answer_agent", retriever="/indexes/wiki", top_k=1, passage_words=None,
                    max_chunks=20)


def _scripted_answer(role, messages):
    # the frozen answer agent: a distractor passage wins, else the gold passage, else a passage-specific wrong answer
    assert role == "answer_agent"
    text = messages[0]["content"]
    for needle, answer in (("Germany", "Berlin"), ("Paris is the capital", "Paris"), ("Lyon is", "Lyon")):
        if needle in text:
            return answer
    return "unknown"


def _query_rows():
    from helpers_agents import KeywordRetriever

    from ragteam.agents.core import QueryPool

    retriever = KeywordRetriever(PASSAGES)
    rows = []
    for rid, first in (("lyon_pool", "Lyon city"), ("paris_pool", "capital France Paris")):
        pool = QueryPool()
        pool.add(first, retriever.search(first, 1))
        rows.append({"id": rid, "question": QUESTION, "golden_answers": ["Paris"], "pool": pool.to_dict()})
    return rows


def _answer_pairs():
    from helpers_agents import KeywordRetriever, ScriptedEngine

    from ragteam.llm import Team
    from ragteam.train.maps import AnswerPairs

    return AnswerPairs(Team(ScriptedEngine(_scripted_answer)), KeywordRetriever(PASSAGES), top_k=1,
                       passage_words=None, max_chunks=20)


# sampled queries per T2 row, and the ΔF1 each must get
QUERY_RESPONSES = {
    "lyon_pool": [("capital France Paris", 1.0),            # retrieves the gold passage: Lyon -> Paris
                  ("New Query: Paris capital France", 1.0),  # the same after the MAPS query parser
                  ("Lyon city", 0.0),                       # its passage is already in the pool: no new chunk
                  ("", 0.0),                                # malformed: retrieves nothing
                  ("Germany Berlin", 0.0)],                 # Lyon -> Berlin, both wrong
    "paris_pool": [("Germany Berlin", -1.0),                # a distractor turns Paris into Berlin
                   ("capital France Paris", 0.0)],
}


@pytest.fixture
def scripted_answer_pairs(monkeypatch):
    """build_answer_pairs replaced by a ScriptedEngine team + KeywordRetriever; records the configs it got."""
    from ragteam.train import openrlhf

    built = []

    def fake(config):
        built.append(config)
        return _answer_pairs()

    monkeypatch.setattr(openrlhf, "build_answer_pairs", fake)
    monkeypatch.setattr(openrlhf, "_ANSWER_PAIRS", {})
    return built


@pytest.mark.slow
def test_generated_query_reward_file_matches_the_trl_reward(smollm2_dir, scripted_answer_pairs, tmp_path):
    import torch
    from transformers import AutoTokenizer

    from ragteam.train.maps import query_reward_func, query_samples

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    samples = query_samples(_query_rows(), passage_words=None)
    job = prepare_query_grpo_job(samples, tmp_path / "job", model_path="/m", output_dir="/out", params=PAPER,
                                 **QUERY_CONFIG, special_tokens=tok.all_special_tokens,
                                 cluster=CLUSTER.model_copy(update={"project_dir": str(REPO)}))
    text = job.reward_file.read_text()
    assert "'answer_model': '/models/answer_agent'" in text and "'retriever': '/indexes/wiki'" in text
    assert "'engine_backend': 'vllm'" in text and "Eq. 7" in text
    reward_func = _load_reward_module(job.reward_file).reward_func

    trl_reward = query_reward_func(_answer_pairs())  # the TRL path, its own answer agent and cache
    scored = []
    for row in load_jsonl(job.dataset):
        label = json.loads(row["label"])
        assert label["question"] == QUESTION and label["golden_answers"] == ["Paris"] and label["pool"]["queries"]
        prompt_ids = tok.apply_chat_template(row["input"], add_generation_prompt=True, return_dict=True)["input_ids"]
        prompt = tok.apply_chat_template(row["input"], add_generation_prompt=True, tokenize=False)
        for text, want in QUERY_RESPONSES[row["id"]]:
            resp = tok(text, add_special_tokens=False)["input_ids"] + [eot]
            # OpenRLHF: one sample per call, prompt + response decoded together with special tokens
            out = reward_func([tok.decode(prompt_ids + resp, skip_special_tokens=False)], [prompt], [row["label"]])
            assert set(out) == {"rewards", "scores", "extra_logs"}
            assert isinstance(out["rewards"], torch.Tensor) and out["rewards"].shape == (1,)
            # TRL: conversational completion without special tokens, golden answers and meta from the columns
            sample = next(s for s in samples if s.id == row["id"])
            completion = [{"role": "assistant", "content": tok.decode(resp, skip_special_tokens=True)}]
            expected = trl_reward(completions=[completion], golden_answers=[sample.golden_answers],
                                  meta=[json.dumps(sample.meta)])[0]
            assert out["rewards"].item() == pytest.approx(expected, abs=1e-6) == want, (row["id"], text)
            assert out["extra_logs"]["delta_f1_zero"].item() == float(want == 0)
            scored.append(want)
    assert max(scored) == 1.0 and min(scored) == -1.0 and 0.0 in scored
    # the answer agent and retriever were built once, from the config written into the reward file
    assert len(scored) == 7 and len(scripted_answer_pairs) == 1
    assert scripted_answer_pairs[0]["answer_model"] == "/models/answer_agent"
    assert scripted_answer_pairs[0]["top_k"] == 1


def test_query_rewards_use_the_cached_answer_pairs(scripted_answer_pairs):
    from ragteam.train.maps import query_samples

    samples = query_samples(_query_rows(), passage_words=None)
    labels = [json.dumps({"golden_answers": s.golden_answers, **s.meta}) for s in samples]
    config = {"engine_backend": "vllm", **QUERY_CONFIG}
    rewards, zero = openrlhf_query_rewards(["P capital France Paris<|im_end|>", "P Germany Berlin"], ["P ", "P "],
                                           labels, config=config, special_tokens=["<|im_end|>"])
    assert rewards == [1.0, -1.0] and zero == [0.0, 0.0]
    rewards, zero = openrlhf_query_rewards(["P Lyon city"], ["P "], labels[:1], config=config, special_tokens=[])
    assert rewards == [0.0] and zero == [1.0]
    assert len(scripted_answer_pairs) == 1  # same config: the same AnswerPairs (and its answer cache)


@pytest.mark.parametrize("label,match", [
    ("not json", "not JSON"),
    (json.dumps(["Paris"]), "JSON object"),
    (json.dumps({"golden_answers": ["Paris"], "question": QUESTION}), "lacks pool"),
    (json.dumps({"golden_answers": [], "question": QUESTION, "pool": {"queries": [], "docs": []}}),
     "golden_answers"),
    (json.dumps({"golden_answers": ["Paris"], "question": QUESTION, "pool": {"queries": ["q"]}}),
     "pool is not a valid query pool"),
])
def test_malformed_query_label_fails_with_a_clear_message(label, match, scripted_answer_pairs):
    with pytest.raises(ValueError, match=match):
        decode_query_label(label)
    with pytest.raises(ValueError, match="query-agent label"):
        openrlhf_query_rewards(["P q"], ["P "], [label], config={"engine_backend": "vllm", **QUERY_CONFIG},
                               special_tokens=[])
    assert not scripted_answer_pairs  # failed before loading anything


def test_query_job_without_pool_in_meta_fails(tmp_path):
    with pytest.raises(ValueError, match=r"query sample 0 \(id='q1'\).*question / pool"):
        prepare_query_grpo_job(SAMPLES, tmp_path / "j", model_path="/m", output_dir="/o", params=PAPER,
                               **QUERY_CONFIG, special_tokens=[], cluster=CLUSTER)


def test_query_job_command_has_the_paper_query_grpo_values(tmp_path):
    from ragteam.train.maps import query_samples

    params = GRPOParams(steps=100, prompts_per_step=32, num_generations=16, micro_batch_size=4, lr=1e-6,
                        kl_beta=1e-4, max_completion_length=24, save_steps=50)
    job = prepare_query_grpo_job(query_samples(_query_rows(), passage_words=50) * 20, tmp_path / "job",
                                 model_path="/models/llama-3.1-8b-instruct", output_dir="/models/query_agent",
                                 params=params, **QUERY_CONFIG, special_tokens=["<|eot_id|>"], cluster=CLUSTER)
    cmd = job.command
    line = job.dry_run()
    job_dir = tmp_path / "job"
    for flags in (f"--reward.remote_url {job_dir}/reward_func.py", "--algo.advantage.estimator group_norm",
                  "--rollout.n_samples_per_prompt 16", "--actor.adam.lr 1e-06", "--algo.kl.init_coef 0.0001"):
        assert flags in line, flags
    assert job.reward_file == job_dir / "reward_func.py" and job.dataset == job_dir / "prompts.jsonl"
    assert _value(cmd, "--data.prompt_dataset") == str(job.dataset) and _value(cmd, "--data.label_key") == "label"
    assert _value(cmd, "--ckpt.output_dir") == "/models/query_agent"
    assert shlex.split((job_dir / "command.sh").read_text().splitlines()[1]) == cmd
    row = load_jsonl(job.dataset)[0]
    assert row["datasource"] == "query_agent" and row["input"][0]["role"] == "system"
    assert set(json.loads(row["label"])) == {"golden_answers", "question", "pool"}
