"""OpenRLHF backend (Ray / DeepSpeed / vLLM GPU cluster): datasets, the reward-function file and the commands.

Nothing here imports OpenRLHF: the orchestrator writes the files and builds the command (v0.10.2+ dotted flags,
see ../shared/notes/interfaces.md section 1); a dry run prints it, `submit` runs it on the Ray cluster as a Ray job
(`ragteam.ray_jobs`, the Jobs REST API: the main environment has no `ray`), waits, and brings its logs back.
`runner: local` runs the judge's SFT here instead (`run_local_sft`): `openrlhf.cli.train_sft` in its own environment
.venv-openrlhf as one process (scripts/openrlhf_cpu.py: on the CPU where CUDA is absent), and `load_local_sft` reads
its checkpoint back as a `TrainResult`, so the stage saves and evaluates it as it does the TRL judge.
The reward file calls the same library reward as the TRL backend (`ragteam.rewards.maps` via `openrlhf_answer_rewards`; the query agent's ΔF1
via `openrlhf_query_rewards`, which calls `ragteam.train.maps.query_reward_func` itself).

How OpenRLHF calls `reward_func` (openrlhf/utils/agent.py, SingleTurnAgentExecutor): once per sample, with
`queries` = decode(prompt_ids + response_ids, skip_special_tokens=False) (chat template and special tokens
included), `prompts` = the templated prompt text, `labels` = the row's `--data.label_key` value verbatim.
"""
from __future__ import annotations

import hashlib
import json
import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from ragteam.config import Strict
from ragteam.metrics import exact_match
from ragteam.io import atomic_file, write_jsonl
from ragteam.ray_jobs import RayJobs, submission_id
from ragteam.rewards.maps import ANSWER_REWARDS, AnswerReward
from ragteam.train.common import GRPOParams, GRPOSample, validate_samples
from ragteam.train.sft import SFTParams, SFTSample

INPUT_KEY, LABEL_KEY, OUTPUT_KEY = "input", "label", "output"


class OpenRLHFCluster(Strict):
    """Where and how the job runs (params.yaml: `openrlhf`). Paths must be valid on the cluster nodes."""

    ray_address: str = "http://127.0.0.1:8265"
    project_dir: str                                   # this repo on the cluster's shared FS (import ragteam)
    num_nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(8, ge=1)               # actor and reference
    vllm_engines: int = Field(8, ge=1)
    vllm_tensor_parallel_size: int = Field(1, ge=1)
    vllm_gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    colocate_all: bool = True                          # actor, ref and vLLM share GPUs (sleep modes on)
    zero_stage: Literal[0, 1, 2, 3] = 3
    micro_train_batch_size: int = Field(4, ge=1)
    micro_rollout_batch_size: int = Field(8, ge=1)
    max_len: int = Field(4096, ge=16)                  # --data.max_len: prompt + response tokens
    attn_implementation: str = "flash_attention_2"
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    # ray: submit the job to the Ray cluster at ray_address (above); local: run it here, one process, in
    # .venv-openrlhf (`make setup-openrlhf`) through scripts/openrlhf_cpu.py: on the CPU where there is no CUDA (SFT)
    runner: Literal["ray", "local"] = "ray"


@dataclass
class OpenRLHFJob:
    dataset: Path
    command: list[str]              # what command.sh holds: `ray job submit ... -- python3 -m ...`, or `deepspeed ...`
    runtime_env: dict               # the Ray job's runtime env (`runtime_env`)
    project_dir: str                # the job runs there: the dataset and reward paths are relative to it
    output_dir: str                 # where OpenRLHF saves the trained model (--ckpt.output_dir)
    reward_file: Path | None = None

    def dry_run(self) -> str:
        return shlex.join(self.command)

    @property
    def entrypoint(self) -> list[str]:
        """What runs on the cluster: the command after `ray job submit ... --`, or the whole deepspeed command."""
        if self.command[:3] == ["ray", "job", "submit"]:
            return self.command[self.command.index("--") + 1:]
        return self.command

    def submission_id(self, name: str) -> str:
        """`ragteam-<name>-<hash>` of the entrypoint, the runtime env and the bytes of the dataset and reward file:
        the same job gets the same id on a rerun (so it is not trained twice), a changed one a new id."""
        files = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (self.dataset, self.reward_file) if p]
        return submission_id(f"ragteam-{name}", self.entrypoint, self.runtime_env, self.project_dir, files)


# ---- the reward path called from the generated file ------------------------------------------------------------

def response_from_query(query: str, prompt: str, special_tokens: Sequence[str]) -> str:
    """The generated answer inside an OpenRLHF query: query[len(prompt):] without special tokens and whitespace."""
    if query.startswith(prompt):
        response = query[len(prompt):]
    else:  # decode(prompt_ids) may not reproduce the prompt text byte for byte; cut after its last line instead
        tail = prompt.rstrip().rsplit("\n", 1)[-1]
        i = query.rfind(tail)
        response = query[i + len(tail):] if tail and i >= 0 else query
    for tok in sorted(special_tokens, key=len, reverse=True):
        response = response.replace(tok, "")
    return response.strip()


def decode_label(label: Any) -> list[str]:
    """Golden answers from an OpenRLHF label: a JSON-encoded list (what we write) or a plain string."""
    if isinstance(label, str):
        try:
            label = json.loads(label)
        except json.JSONDecodeError:
            return [label]
    return [label] if isinstance(label, str) else [str(x) for x in label]


def openrlhf_answer_rewards(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any], *,
                            stage: str, alpha: float, max_words: int, min_words: int = 0,
                            format_penalty: float | None = None,
                            special_tokens: Sequence[str]) -> tuple[list[float], list[float]]:
    """(rewards, EM) for OpenRLHF samples with the answer-agent reward of `stage` (Eq. 4 / Eq. 5), on the answer as
    the pipeline parses it (`AnswerReward`, the same scorer as the TRL backend)."""
    reward = AnswerReward(stage, alpha, max_words, min_words, format_penalty)
    rewards, ems = [], []
    for q, p, label in zip(queries, prompts, labels, strict=True):
        golds = decode_label(label)
        r, y = reward(response_from_query(q, p, special_tokens), golds)
        rewards.append(r)
        ems.append(exact_match(y, golds))
    return rewards, ems


_REWARD_FILE = '''"""OpenRLHF reward function (--reward.remote_url), written by ragteam.train.openrlhf.write_reward_file.

reward: {reward_name} (MAPS {equation}), alpha={alpha}, l={max_words} words, min_words={min_words},
format_penalty={format_penalty} (an output with no parseable answer; None = the equation's value for the empty answer)
OpenRLHF loads this file with importlib.util.spec_from_file_location and calls reward_func once per sample with
the prompt and response decoded together; the reward is the library's, as in the TRL backend.
"""
import sys

PROJECT_DIR = {project_dir!r}
if PROJECT_DIR not in sys.path:
    sys.path.insert(0, PROJECT_DIR)

import torch  # noqa: E402

from ragteam.train.openrlhf import openrlhf_answer_rewards  # noqa: E402

CONFIG = {config!r}


def reward_func(queries, prompts, labels, **kwargs):
    rewards, em = openrlhf_answer_rewards(queries, prompts, labels, **CONFIG)
    return {{
        "rewards": torch.tensor(rewards, dtype=torch.float32),   # advantages (group_norm)
        "scores": torch.tensor(em, dtype=torch.float32),         # 0/1, for dynamic filtering
        "extra_logs": {{"em": torch.tensor(em, dtype=torch.float32)}},
    }}
'''


def write_reward_file(path: str | Path, *, reward: AnswerReward, special_tokens: Sequence[str],
                      project_dir: str) -> Path:
    """Write the `reward_func` file for one answer-agent GRPO stage; it records the reward and its constants."""
    config = {"stage": reward.equation, "alpha": reward.alpha, "max_words": reward.max_words,
              "min_words": reward.min_words, "format_penalty": reward.format_penalty,
              "special_tokens": list(special_tokens)}
    text = _REWARD_FILE.format(reward_name=ANSWER_REWARDS[reward.equation].__name__,
                               equation={"stage1": "Eq. 4", "stage2": "Eq. 5"}[reward.equation], alpha=reward.alpha,
                               max_words=reward.max_words, min_words=reward.min_words,
                               format_penalty=reward.format_penalty, project_dir=str(project_dir), config=config)
    with atomic_file(path) as f:
        f.write(text)
    return Path(path)


# ---- the query agent: R_q = ΔF1 (MAPS Eq. 7) --------------------------------------------------------------------

# config JSON -> AnswerPairs (the frozen answer agent + retriever); one per reward process, built on first use
_ANSWER_PAIRS: dict[str, Any] = {}


def build_answer_pairs(config: dict):
    """The `AnswerPairs` of a query-reward config: the frozen answer agent (greedy) and the retriever.

    Looked up by module attribute at call time, so tests replace it (monkeypatch) with a scripted team.
    """
    from ragteam.llm import EngineConfig, EnginePool, SamplingConfig
    from ragteam.retrieval import open_retriever
    from ragteam.train.maps import AnswerPairs

    pool = EnginePool(EngineConfig(backend=config["engine_backend"], device=config.get("device", "auto"),
                                   dtype=config.get("dtype", "auto")))
    greedy = SamplingConfig(max_new_tokens=config.get("answer_max_new_tokens", 24), temperature=0.0)
    team = pool.team({"answer_agent": config["answer_model"]}, config["answer_model"], {"answer_agent": greedy})
    return AnswerPairs(team, open_retriever(config["retriever"]), config["top_k"], config["passage_words"],
                       config["max_chunks"])


def answer_pairs_for(config: dict):
    """The cached `AnswerPairs` for `config` (keyed by its JSON): answers stay cached across reward calls."""
    key = json.dumps(config, sort_keys=True)
    if key not in _ANSWER_PAIRS:
        _ANSWER_PAIRS[key] = build_answer_pairs(config)
    return _ANSWER_PAIRS[key]


def decode_query_label(label: Any) -> tuple[list[str], dict[str, Any]]:
    """(golden answers, meta) from a query-agent label `{"golden_answers": [...], "question": ..., "pool": {...}}`.

    `meta` = {"question", "pool"} as `query_samples` puts it in a sample's meta; a malformed label is a ValueError
    that names what is wrong.
    """
    from ragteam.agents.core import QueryPool

    shown = repr(label)[:200]
    if isinstance(label, str):
        try:
            label = json.loads(label)
        except json.JSONDecodeError as e:
            raise ValueError(f"query-agent label is not JSON ({e}): {shown}") from None
    if not isinstance(label, dict):
        raise ValueError(f"query-agent label must be a JSON object with golden_answers, question and pool, got "
                         f"{type(label).__name__}: {shown}")
    missing = [k for k in ("golden_answers", "question", "pool") if k not in label]
    if missing:
        raise ValueError(f"query-agent label lacks {', '.join(missing)}: {shown}")
    golds = label["golden_answers"]
    if isinstance(golds, str):
        golds = [golds]
    if not isinstance(golds, list) or not golds or not all(isinstance(g, str) for g in golds):
        raise ValueError(f"query-agent label: golden_answers must be a non-empty list of strings: {shown}")
    if not isinstance(label["question"], str) or not label["question"].strip():
        raise ValueError(f"query-agent label: question must be a non-empty string: {shown}")
    try:
        QueryPool.from_dict(label["pool"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"query-agent label: pool is not a valid query pool ({type(e).__name__}: {e}): "
                         f"{shown}") from None
    return list(golds), {"question": label["question"], "pool": label["pool"]}


def openrlhf_query_rewards(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any], *,
                           config: dict, special_tokens: Sequence[str]) -> tuple[list[float], list[float]]:
    """(ΔF1 rewards, zero flags) for OpenRLHF query-agent samples (MAPS Eq. 7).

    The score is the TRL backend's own reward callable, `ragteam.train.maps.query_reward_func`, over the cached
    `AnswerPairs` of `config` (see `build_answer_pairs`), so the two backends cannot diverge. zero flag = 1.0 where
    ΔF1 == 0 (malformed query, no new chunk, or the same F1).
    """
    from ragteam.train.maps import query_reward_func

    responses, golds, metas = [], [], []
    for q, p, label in zip(queries, prompts, labels, strict=True):
        g, meta = decode_query_label(label)
        responses.append(response_from_query(q, p, special_tokens))
        golds.append(g)
        metas.append(json.dumps(meta, ensure_ascii=False))
    reward = query_reward_func(answer_pairs_for(config))
    rewards = [float(r) for r in reward(completions=responses, golden_answers=golds, meta=metas)]
    return rewards, [float(r == 0) for r in rewards]


_QUERY_REWARD_FILE = '''"""OpenRLHF reward function (--reward.remote_url) for the query agent.

Written by ragteam.train.openrlhf.write_query_reward_file.

reward: R_q = F1(y_{{n+1}}, y*) - F1(y_n, y*) (MAPS Eq. 7), the frozen answer agent {answer_model} (greedy) with
and without the chunks the sanitised query retrieves from {retriever} (top_k={top_k}).
OpenRLHF loads this file with importlib.util.spec_from_file_location and calls reward_func once per sample with
the prompt and response decoded together; the reward is the library's, as in the TRL backend. The answer agent and
retriever are loaded once per process, on the first call.
"""
import sys

PROJECT_DIR = {project_dir!r}
if PROJECT_DIR not in sys.path:
    sys.path.insert(0, PROJECT_DIR)

import torch  # noqa: E402

from ragteam.train.openrlhf import openrlhf_query_rewards  # noqa: E402

CONFIG = {config!r}
SPECIAL_TOKENS = {special_tokens!r}


def reward_func(queries, prompts, labels, **kwargs):
    rewards, zero = openrlhf_query_rewards(queries, prompts, labels, config=CONFIG, special_tokens=SPECIAL_TOKENS)
    return {{
        "rewards": torch.tensor(rewards, dtype=torch.float32),   # advantages (group_norm)
        "scores": torch.tensor(rewards, dtype=torch.float32),    # ΔF1 in [-1, 1]
        "extra_logs": {{"delta_f1_zero": torch.tensor(zero, dtype=torch.float32)}},
    }}
'''


def write_query_reward_file(path: str | Path, *, config: dict, special_tokens: Sequence[str],
                            project_dir: str) -> Path:
    """Write the `reward_func` file for the query agent; `config` (answer model, retriever, top_k, ...) is
    recorded in it and keys the `AnswerPairs` cache."""
    missing = {"engine_backend", "answer_model", "retriever", "top_k", "passage_words", "max_chunks"} - set(config)
    if missing:
        raise ValueError(f"query reward config lacks {sorted(missing)}")
    text = _QUERY_REWARD_FILE.format(answer_model=config["answer_model"], retriever=config["retriever"],
                                     top_k=config["top_k"], project_dir=str(project_dir), config=dict(config),
                                     special_tokens=list(special_tokens))
    with atomic_file(path) as f:
        f.write(text)
    return Path(path)


# ---- datasets and commands -------------------------------------------------------------------------------------

def write_prompt_dataset(path: str | Path, samples: Sequence[GRPOSample | dict], datasource: str) -> int:
    """GRPO prompts as JSONL: `input` = chat messages (--data.apply_chat_template), `label` = JSON golden answers."""
    rows = validate_samples(samples)
    return write_jsonl(path, ({"id": s.id, INPUT_KEY: s.prompt, LABEL_KEY: json.dumps(s.golden_answers),
                               "datasource": datasource} for s in rows))


def write_query_prompt_dataset(path: str | Path, samples: Sequence[GRPOSample | dict]) -> int:
    """Query-agent GRPO prompts as JSONL: `input` = chat messages, `label` = JSON {golden_answers, question, pool}
    (the sample's meta from `ragteam.train.maps.query_samples`)."""
    rows = validate_samples(samples)
    out = []
    for i, s in enumerate(rows):
        if not isinstance(s.meta.get("question"), str) or not isinstance(s.meta.get("pool"), dict):
            raise ValueError(f"query sample {i} (id={s.id!r}) has no question / pool in its meta "
                             f"(build it with query_samples, the query agent's sample builder)")
        label = {"golden_answers": s.golden_answers, "question": s.meta["question"], "pool": s.meta["pool"]}
        decode_query_label(label)  # fail here, not on the cluster
        out.append({"id": s.id, INPUT_KEY: s.prompt, LABEL_KEY: json.dumps(label, ensure_ascii=False),
                    "datasource": "query_agent"})
    return write_jsonl(path, out)


def write_sft_dataset(path: str | Path, samples: Sequence[SFTSample | dict]) -> int:
    """SFT pairs as JSONL: `input` = prompt messages, `output` = [assistant message] (loss on the response only)."""
    rows = validate_samples(samples, SFTSample)
    return write_jsonl(path, ({"id": s.id, INPUT_KEY: s.prompt,
                               OUTPUT_KEY: [{"role": "assistant", "content": s.completion}]} for s in rows))


def _lora_flags(lora) -> list[str]:
    if not lora.enabled:
        return []
    if lora.top_layers is not None:
        raise ValueError("lora.top_layers is a TRL/CPU option; OpenRLHF applies LoRA to every layer")
    return ["--ds.lora.rank", str(lora.rank), "--ds.lora.alpha", str(lora.alpha), "--ds.lora.dropout",
            str(lora.dropout), "--ds.lora.target_modules", *lora.target_modules]


def grpo_args(*, model_path: str, dataset: str, reward_file: str, output_dir: str, ckpt_path: str,
              params: GRPOParams, cluster: OpenRLHFCluster, n_prompts: int) -> list[str]:
    """`openrlhf.cli.train_ppo_ray` flags for GRPO: group_norm advantages, KL as a loss term (k3)."""
    # one optimiser step = one rollout batch of P prompts x G samples, as in the TRL backend
    wanted = params.steps * params.prompts_per_step
    episodes = max(math.ceil(wanted / n_prompts), 1)
    max_samples = min(n_prompts, wanted) if episodes == 1 else n_prompts
    gpus = cluster.num_nodes * cluster.gpus_per_node
    args = [
        "--actor.model_name_or_path", model_path,
        "--actor.num_nodes", str(cluster.num_nodes), "--actor.num_gpus_per_node", str(cluster.gpus_per_node),
        "--ref.num_nodes", str(cluster.num_nodes), "--ref.num_gpus_per_node", str(cluster.gpus_per_node),
        "--vllm.num_engines", str(cluster.vllm_engines),
        "--vllm.tensor_parallel_size", str(cluster.vllm_tensor_parallel_size),
        "--vllm.gpu_memory_utilization", str(cluster.vllm_gpu_memory_utilization),
        "--reward.remote_url", reward_file,
        "--data.prompt_dataset", dataset, "--data.input_key", INPUT_KEY, "--data.label_key", LABEL_KEY,
        "--data.apply_chat_template", "--data.max_len", str(cluster.max_len),
        "--data.max_samples", str(max_samples),
        "--algo.advantage.estimator", "group_norm",
        "--rollout.n_samples_per_prompt", str(params.num_generations),
        "--rollout.batch_size", str(params.prompts_per_step),
        "--rollout.micro_batch_size", str(cluster.micro_rollout_batch_size),
        "--rollout.max_new_tokens", str(params.max_completion_length),
        "--rollout.temperature", str(params.temperature),
        "--train.batch_size", str(params.prompts_per_step * params.num_generations),
        "--train.micro_batch_size", str(cluster.micro_train_batch_size),
        "--train.max_epochs", "1", "--train.num_episodes", str(episodes), "--train.seed", str(params.seed),
        "--actor.adam.lr", str(params.lr), "--actor.lr_scheduler", params.lr_scheduler,
        "--actor.lr_warmup_ratio", "0",
        "--algo.kl.init_coef", str(params.kl_beta),
        *(["--algo.kl.use_loss", "--algo.kl.estimator", cluster.kl_estimator] if params.kl_beta > 0 else []),
        "--ds.zero_stage", str(cluster.zero_stage), "--ds.param_dtype", "bf16",
        "--ds.attn_implementation", cluster.attn_implementation,
        "--ckpt.output_dir", output_dir, "--ckpt.path", ckpt_path, "--ckpt.save_steps", str(params.save_steps),
        "--ckpt.max_num", str(params.save_total_limit), "--ckpt.load_enable", "--ckpt.save_hf",
        "--logger.logging_steps", "1",
        *(["--actor.gradient_checkpointing_enable"] if params.gradient_checkpointing else []),
        *_lora_flags(params.lora),
    ]
    if cluster.colocate_all:
        if cluster.vllm_engines * cluster.vllm_tensor_parallel_size != gpus:
            raise ValueError(f"colocate_all needs vllm_engines x tensor_parallel_size == {gpus} GPUs")
        args += ["--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep"]
    return args


def runtime_env(cluster: OpenRLHFCluster) -> dict:
    """The Ray job's runtime env: ragteam on the path (the reward file imports it); Ray must not narrow
    CUDA_VISIBLE_DEVICES (OpenRLHF places its actors on the GPUs itself)."""
    return {"env_vars": {"PYTHONPATH": cluster.project_dir, "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
                         "OMP_WAIT_POLICY": "PASSIVE"}}


def ray_submit_command(train_args: list[str], cluster: OpenRLHFCluster) -> list[str]:
    """`ray job submit ... -- python3 -m openrlhf.cli.train_ppo_ray <args>` (command.sh; `submit` sends the same
    entrypoint and runtime env through the Jobs API)."""
    return ["ray", "job", "submit", "--address", cluster.ray_address, "--runtime-env-json",
            json.dumps(runtime_env(cluster), sort_keys=True), "--", "python3", "-m", "openrlhf.cli.train_ppo_ray",
            *train_args]


def sft_command(*, model_path: str, dataset: str, output_dir: str, ckpt_path: str, params: SFTParams,
                cluster: OpenRLHFCluster) -> list[str]:
    """`deepspeed --module openrlhf.cli.train_sft`: chat template + input/output keys, loss on the response only."""
    if params.steps != -1:
        raise ValueError("OpenRLHF SFT runs whole epochs: set sft steps to -1 and use epochs")
    return [
        "deepspeed", "--num_gpus", str(cluster.gpus_per_node), "--module", "openrlhf.cli.train_sft",
        "--model.model_name_or_path", model_path,
        "--data.dataset", dataset, "--data.input_key", INPUT_KEY, "--data.output_key", OUTPUT_KEY,
        "--data.apply_chat_template", "--data.max_len", str(params.max_length),
        "--train.batch_size", str(params.batch_size * params.grad_accum),
        "--train.micro_batch_size", str(cluster.micro_train_batch_size),
        "--train.max_epochs", str(math.ceil(params.epochs)), "--train.seed", str(params.seed),
        "--adam.lr", str(params.lr),
        "--ds.zero_stage", str(cluster.zero_stage), "--ds.param_dtype", "bf16",
        "--ds.attn_implementation", cluster.attn_implementation,
        "--ckpt.output_dir", output_dir, "--ckpt.path", ckpt_path, "--ckpt.save_steps", str(params.save_steps),
        "--ckpt.max_num", str(params.save_total_limit), "--ckpt.load_enable", "--logger.logging_steps", "1",
        *(["--model.gradient_checkpointing_enable"] if params.gradient_checkpointing else []),
        *_lora_flags(params.lora),
    ]


def prepare_answer_grpo_job(samples: Sequence[GRPOSample | dict], job_dir: str | Path, *, model_path: str,
                            output_dir: str, params: GRPOParams, reward: AnswerReward,
                            special_tokens: Sequence[str], cluster: OpenRLHFCluster) -> OpenRLHFJob:
    """Write `<job_dir>/prompts.jsonl` and `reward_func.py` for one answer-agent stage; build the submit command.

    `special_tokens` = the tokenizer's `all_special_tokens` (stripped from decoded responses before scoring).
    """
    job_dir = Path(job_dir)
    dataset = job_dir / "prompts.jsonl"
    n = write_prompt_dataset(dataset, samples, datasource=f"answer_agent_{reward.equation}")
    reward_file = write_reward_file(job_dir / "reward_func.py", reward=reward, special_tokens=special_tokens,
                                    project_dir=cluster.project_dir)
    args = grpo_args(model_path=model_path, dataset=str(dataset), reward_file=str(reward_file),
                     output_dir=output_dir, ckpt_path=str(job_dir / "ckpt"), params=params, cluster=cluster,
                     n_prompts=n)
    job = OpenRLHFJob(dataset=dataset, reward_file=reward_file, command=ray_submit_command(args, cluster),
                      runtime_env=runtime_env(cluster), project_dir=cluster.project_dir, output_dir=output_dir)
    with atomic_file(job_dir / "command.sh") as f:
        f.write("#!/bin/sh\n" + job.dry_run() + "\n")
    return job


def prepare_query_grpo_job(samples: Sequence[GRPOSample | dict], job_dir: str | Path, *, model_path: str,
                           output_dir: str, params: GRPOParams, answer_model: str, retriever: str, top_k: int,
                           passage_words: int | None, max_chunks: int | None, special_tokens: Sequence[str],
                           cluster: OpenRLHFCluster, engine_backend: Literal["hf", "vllm"] = "vllm",
                           device: str = "auto", dtype: str = "auto",
                           answer_max_new_tokens: int = 24) -> OpenRLHFJob:
    """Write `<job_dir>/prompts.jsonl` and `reward_func.py` for the query agent (R_q = ΔF1, MAPS Eq. 7); build the
    submit command (same GRPO flags as the answer agent).

    The reward process loads the frozen answer agent `answer_model` (greedy, `engine_backend`) and the retriever
    `retriever` (paths valid on the cluster) once, on its first call. NOT EXECUTED HERE: this repository's
    machine has no GPU and no OpenRLHF; the files, the command and the reward file's scoring (with a scripted
    answer agent) are tested, and the answer agent's job is submitted to a local Ray cluster (tests/test_ray_jobs.py).
    """
    job_dir = Path(job_dir)
    dataset = job_dir / "prompts.jsonl"
    n = write_query_prompt_dataset(dataset, samples)
    config = {"engine_backend": engine_backend, "device": device, "dtype": dtype, "answer_model": answer_model,
              "answer_max_new_tokens": answer_max_new_tokens, "retriever": retriever, "top_k": top_k,
              "passage_words": passage_words, "max_chunks": max_chunks}
    reward_file = write_query_reward_file(job_dir / "reward_func.py", config=config, special_tokens=special_tokens,
                                          project_dir=cluster.project_dir)
    args = grpo_args(model_path=model_path, dataset=str(dataset), reward_file=str(reward_file),
                     output_dir=output_dir, ckpt_path=str(job_dir / "ckpt"), params=params, cluster=cluster,
                     n_prompts=n)
    job = OpenRLHFJob(dataset=dataset, reward_file=reward_file, command=ray_submit_command(args, cluster),
                      runtime_env=runtime_env(cluster), project_dir=cluster.project_dir, output_dir=output_dir)
    with atomic_file(job_dir / "command.sh") as f:
        f.write("#!/bin/sh\n" + job.dry_run() + "\n")
    return job


def prepare_sft_job(samples: Sequence[SFTSample | dict], job_dir: str | Path, *, model_path: str, output_dir: str,
                    params: SFTParams, cluster: OpenRLHFCluster) -> OpenRLHFJob:
    """Write `<job_dir>/sft.jsonl`; build the deepspeed command (the judge agent, Section 3.4)."""
    job_dir = Path(job_dir)
    dataset = job_dir / "sft.jsonl"
    write_sft_dataset(dataset, samples)
    job = OpenRLHFJob(dataset=dataset, command=sft_command(model_path=model_path, dataset=str(dataset),
                                                           output_dir=output_dir, ckpt_path=str(job_dir / "ckpt"),
                                                           params=params, cluster=cluster),
                      runtime_env=runtime_env(cluster), project_dir=cluster.project_dir, output_dir=output_dir)
    with atomic_file(job_dir / "command.sh") as f:
        f.write("#!/bin/sh\n" + job.dry_run() + "\n")
    return job


def submit(job: OpenRLHFJob, dry_run: bool = True, *, address: str | None = None, name: str = "openrlhf",
           log=print) -> str:
    """Print the job's command (dry run), or run it as a Ray job on the cluster at `address` and wait for it: its
    status changes and logs go to `log`; a FAILED/STOPPED job raises `RayJobFailed` (status message, log tail), an
    unreachable address `RayUnreachable`. Returns the command line.

    The job's id is `job.submission_id(name)`: a rerun of the same job finds it; one that SUCCEEDED is not trained
    again while its `output_dir` exists (DVC deletes a stage's outs before rerunning it: then it is run again),
    one still running is waited on.
    The entrypoint runs in `job.project_dir` (the checkout on the cluster's shared filesystem).
    """
    line = job.dry_run()
    print(line)
    if dry_run:
        return line
    if not address:
        raise ValueError("submit(dry_run=False) needs the Ray job server's address (openrlhf.ray_address)")
    out = Path(job.project_dir) / job.output_dir
    with RayJobs(address) as ray:
        ray.run_job(f"cd {shlex.quote(job.project_dir)} && {shlex.join(job.entrypoint)}",
                    submission_id=job.submission_id(name), runtime_env=job.runtime_env,
                    metadata={"ragteam_job": name}, log=log,
                    rerun_reason=None if out.exists() else f"its output {out} is gone")
    return line
