"""benchmarks/train_stages.py: how a variant is read and applied, and how a stage is started (the runs themselves
take minutes each: benchmarks/results/grpo_rollouts.md has one)."""
import pytest

from benchmarks.train_stages import apply, parse_variant, stage_command


def test_a_variant_names_its_stage_and_its_params_overrides():
    stage, name, ov = parse_variant("train_query:vllm:train_query.grpo.rollout_backend=vllm,llm.threads=1")
    assert (stage, name, ov) == ("train_query", "vllm", {"train_query.grpo.rollout_backend": "vllm", "llm.threads": 1})
    assert parse_variant("train_answer:live") == ("train_answer", "live", {})
    for bad in ("train_answer", ":x", "train_answer:x:steps"):
        with pytest.raises(SystemExit, match="variant"):
            parse_variant(bad)


def test_overrides_set_dotted_keys_on_a_copy_and_a_missing_section_is_named():
    base = {"train_query": {"grpo": {"rollout_backend": "live", "steps": 8}}, "llm": {"stages": {}}}
    out = apply(base, {"train_query.grpo.rollout_backend": "vllm", "llm.stages.train_query": "vllm"})
    assert out["train_query"]["grpo"] == {"rollout_backend": "vllm", "steps": 8}
    assert out["llm"]["stages"] == {"train_query": "vllm"} and base["llm"]["stages"] == {}
    with pytest.raises(SystemExit, match="no section 'nosuch'"):
        apply(base, {"nosuch.key": 1})


def test_a_foreach_stage_runs_its_module_with_the_item_and_reads_its_own_metrics():
    assert stage_command("train_joint@mask") == (["-m", "stages.train_joint", "mask"], "train_joint_mask")
    assert stage_command("train_answer") == (["-m", "stages.train_answer"], "train_answer")


def test_code_from_a_git_ref_is_unpacked_and_installed_in_the_workspace(tmp_path):
    from benchmarks.train_stages import REPO, export_code, install_code, parse_code

    assert parse_code(["before=HEAD~1", "x=abc"]) == {"before": "HEAD~1", "x": "abc"}
    for bad in ("before", "=HEAD", "before="):
        with pytest.raises(SystemExit, match="--code"):
            parse_code([bad])
    src = export_code("HEAD", tmp_path / "code")
    assert (src / "ragteam" / "train" / "sft.py").is_file() and (src / "stages" / "train_joint.py").is_file()
    ws = tmp_path / "ws"
    (ws / "ragteam").mkdir(parents=True)
    (ws / "ragteam" / "stale.py").write_text("# from the last variant\n")
    install_code(ws, src)
    assert not (ws / "ragteam" / "stale.py").exists()
    assert (ws / "stages" / "train_joint.py").read_bytes() == (src / "stages" / "train_joint.py").read_bytes()
    with pytest.raises(SystemExit, match="no-such-ref"):
        export_code("no-such-ref", tmp_path / "bad")
    assert REPO.joinpath("benchmarks", "train_stages.py").is_file()
