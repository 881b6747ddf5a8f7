"""Trained agents get versions as DVC's model registry keeps them (GTO tags), and `dvc artifacts get` fetches a named
version from another directory through the remote."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragteam.registry import RegistryError, register, versions

DVC_YAML = """\
stages:
  train_answer:
    cmd: python -c "import pathlib, yaml; p = pathlib.Path('models/agents/answer'); p.mkdir(parents=True, exist_ok=True); (p / 'weights.txt').write_text(str(yaml.safe_load(open('params.yaml'))['w']))"
    params: [w]
    outs: [models/agents/answer]
artifacts:
  answer-agent:
    path: models/agents/answer
    type: model
  judge-agent:
    path: models/agents/judge
    type: model
"""


def run(args, cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


def dvc(cwd: Path, *args: str) -> str:
    return run([sys.executable, "-m", "dvc", *args], cwd)


def train(repo: Path, w: int) -> None:
    (repo / "params.yaml").write_text(f"w: {w}\n")
    dvc(repo, "repro", "-q")
    dvc(repo, "push", "-q")
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-q", "-m", f"train w={w}"], repo)


@pytest.fixture()
def repo(tmp_path) -> Path:
    r = tmp_path / "project"
    r.mkdir()
    for args in (["init", "-q", "-b", "main"], ["config", "user.email", "t@example.com"], ["config", "user.name", "t"]):
        run(["git", *args], r)
    dvc(r, "init", "-q")
    (r / ".dvc/config").write_text("[core]\n    remote = local\n['remote \"local\"']\n    url = ../../remote\n")
    (r / "dvc.yaml").write_text(DVC_YAML)
    return r


@pytest.mark.slow
def test_registered_versions_are_gto_tags_that_dvc_artifacts_get_fetches(repo, tmp_path):
    train(repo, 1)
    out = run([sys.executable, "-m", "ragteam.cli", "registry", "register", "answer-agent", "--repo", str(repo)],
              tmp_path)
    assert "registered answer-agent@v0.0.1" in out
    first = run(["git", "rev-parse", "HEAD"], repo).strip()
    train(repo, 2)
    second = register(repo, "answer-agent")                     # the next patch version
    assert (second.version, second.tag) == ("v0.0.2", "answer-agent@v0.0.2")
    assert run(["git", "tag", "--list"], repo).split() == ["answer-agent@v0.0.1", "answer-agent@v0.0.2"]
    assert run(["git", "cat-file", "-t", "answer-agent@v0.0.1"], repo).strip() == "tag"      # annotated
    assert [(v.version, v.commit) for v in versions(repo, "answer-agent")] == [("v0.0.1", first),
                                                                                ("v0.0.2", second.commit)]
    listed = run([sys.executable, "-m", "ragteam.cli", "registry", "list", "--repo", str(repo)], tmp_path)
    assert listed.splitlines() == [f"answer-agent\tv0.0.1\t{first[:12]}", f"answer-agent\tv0.0.2\t{second.commit[:12]}"]

    for version, w in (("v0.0.1", "1"), ("v0.0.2", "2")):       # another directory fetches each version
        dest = tmp_path / f"got-{version}"
        dvc(tmp_path, "artifacts", "get", str(repo), "answer-agent", "--rev", version, "-o", str(dest))
        assert (dest / "weights.txt").read_text() == w


def test_register_refuses_what_is_not_a_produced_artifact_or_not_a_version(repo, tmp_path):
    train(repo, 1)
    with pytest.raises(RegistryError, match=r"'nosuch' is not in dvc.yaml's artifacts .*answer-agent, judge-agent"):
        register(repo, "nosuch")
    with pytest.raises(RegistryError, match="models/agents/judge is not an output in dvc.lock"):
        register(repo, "judge-agent")
    with pytest.raises(RegistryError, match="expected v<major>.<minor>.<patch>"):
        register(repo, "answer-agent", version="1.0")
    register(repo, "answer-agent", version="v1.0.0")
    with pytest.raises(RegistryError, match="already registered"):
        register(repo, "answer-agent", version="v1.0.1")          # one version per commit
    done = subprocess.run([sys.executable, "-m", "ragteam.cli", "registry", "register", "nosuch", "--repo",
                           str(repo)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.startswith("ERROR artifact 'nosuch'") and "Traceback" not in done.stderr


@pytest.mark.slow
def test_registry_list_and_get_name_a_user_mistake_in_one_line(repo, tmp_path):
    """An unknown artifact or version, or weights no cache or remote holds: one ERROR line with the fix, exit 1."""
    import shutil

    train(repo, 1)
    register(repo, "answer-agent")

    def cli(*args):
        done = subprocess.run([sys.executable, "-m", "ragteam.cli", "registry", *args], capture_output=True,
                              text=True, cwd=repo, timeout=300)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("ERROR "), done.stderr
        assert "Traceback" not in done.stderr
        return lines[0]

    assert "artifact 'nosuch' is not in dvc.yaml's artifacts and has no registered version (declared: answer-agent, " \
           "judge-agent)" in cli("list", "nosuch")
    assert versions(repo, "judge-agent") == []                 # declared, never registered: nothing to list
    assert "no tag answer-agent@v0.0.9: v0.0.9 of 'answer-agent' is not registered" in cli(
        "get", "answer-agent", "v0.0.9", "-o", str(tmp_path / "a"))
    assert "no tag nosuch@v0.0.1" in cli("get", "nosuch", "v0.0.1", "-o", str(tmp_path / "b"))
    # the weights are here, but this toy agent has no model card
    assert "models/agents/answer has no README.md" in cli("get", "answer-agent", "v0.0.1", "-o", str(tmp_path / "c"))
    # a fresh clone whose remote never got the weights: the fix is a push, not a card
    shutil.rmtree(tmp_path / "remote")
    run(["git", "clone", "-q", str(repo), str(tmp_path / "fresh")], tmp_path)
    repo = tmp_path / "fresh"
    line = cli("get", "answer-agent", "v0.0.1", "-o", str(tmp_path / "d"))
    assert "in neither the DVC cache nor the remote" in line and "dvc push" in line
    assert not (tmp_path / "a").exists() and not (tmp_path / "d").exists()


# ---- release cards: `ragteam registry get` (ragteam.release) ----

TRAIN_PY = """\
import pathlib, yaml
w = yaml.safe_load(open("params.yaml"))["w"]
p = pathlib.Path("models/agents/mask"); p.mkdir(parents=True, exist_ok=True)
(p / "weights.txt").write_text(str(w))
(p / "README.md").write_text("---\\nbase_model: models/llm\\nragteam:\\n  agent: mask\\n---\\n\\n# mask\\n\\n"
                             "## Evaluation\\n\\nThis card holds the training metrics; see reports/eval.md.\\n\\n"
                             "## Data\\n\\n| name | rows |\\n|---|---:|\\n| traces | 3 |\\n")
"""
# scores that follow the weights, in the records' real shape (ragteam.eval.evaluate / stats)
EVALUATE_PY = """\
import json, pathlib
w = int(pathlib.Path("models/agents/mask/weights.txt").read_text())
row = lambda f1: {"n": 40.0, "em": f1 / 2, "f1": f1, "no_answer": 5.0, "em_ci": [0.0, f1], "f1_ci": [f1 - 2, f1 + 2],
                  "no_answer_ci": [0.0, 10.0]}
pathlib.Path("metrics").mkdir(exist_ok=True)
json.dump({"mask": {"synthetic": row(3.0), "avg": row(3.0)},
           "mask_trained": {"synthetic": row(10.0 * w), "avg": row(10.0 * w)}}, open("metrics/eval.json", "w"))
d = lambda x: {"diff": x, "lo": x - 1, "hi": x + 1, "n": 40, "significant": x - 1 > 0}
json.dump({"mask_trained vs mask": {"a": "mask_trained", "b": "mask", "synthetic": {"n": 40, "em": d(1.0),
           "f1": d(10.0 * w - 3)}, "avg": {"n": 40, "em": d(1.0), "f1": d(10.0 * w - 3)}}},
          open("metrics/eval_compare.json", "w"))
"""
RELEASE_DVC_YAML = """\
stages:
  train_joint_mask:
    cmd: python train.py
    deps: [train.py]
    params: [w]
    outs: [models/agents/mask]
  evaluate:
    cmd: python evaluate.py
    deps: [evaluate.py, models/agents]
    params: [eval]
    outs:
      - metrics/eval.json: {cache: false}
      - metrics/eval_compare.json: {cache: false}
artifacts:
  mask-agent:
    path: models/agents/mask
    type: model
"""


def release_params(w: int, n: int = 40) -> str:
    return (f"w: {w}\neval:\n  n_questions: {n}\n  systems:\n    mask: {{workflow: mask}}\n"
            "    mask_trained: {workflow: mask, model: models/agents/mask}\n")


def commit_run(repo: Path, w: int, *stages: str, n: int = 40) -> str:
    (repo / "params.yaml").write_text(release_params(w, n))
    dvc(repo, "repro", "-q", *(["-s", *stages] if stages else []))
    dvc(repo, "push", "-q")
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-q", "-m", f"w={w} {' '.join(stages) or 'all'}"], repo)
    return run(["git", "rev-parse", "HEAD"], repo).strip()


@pytest.mark.slow
def test_registry_get_writes_a_release_card_with_the_evaluation_of_exactly_these_weights(repo, tmp_path):
    """The fetched copy's card carries the tagged commit's scores with intervals, in markdown and as model-index;
    a version whose evaluate ran on other weights, or on other params, is refused and leaves nothing behind."""
    from ragteam.release import get_release
    from ragteam.train.model_card import front_matter

    (repo / "dvc.yaml").write_text(RELEASE_DVC_YAML)
    (repo / "train.py").write_text(TRAIN_PY)
    (repo / "evaluate.py").write_text(EVALUATE_PY)
    first = commit_run(repo, 1)
    register(repo, "mask-agent", "v0.0.1")
    dest = tmp_path / "release-1"
    out = run([sys.executable, "-m", "ragteam.cli", "registry", "get", "mask-agent", "v0.0.1", "--repo", str(repo),
               "-o", str(dest)], tmp_path)
    assert f"mask-agent@v0.0.1 -> {dest}" in out
    assert (dest / "weights.txt").read_text() == "1"
    card = (dest / "README.md").read_text()
    front = front_matter(card)
    assert front["base_model"] == "models/llm" and front["ragteam"]["agent"] == "mask"      # the training card's
    assert front["ragteam"]["release"] == {"artifact": "mask-agent", "version": "v0.0.1", "commit": first,
                                           "evaluated_by": {"evaluate": ["mask_trained"]}}
    [index] = front["model-index"]
    assert index["name"] == "mask-agent@v0.0.1"
    assert [(r["dataset"]["name"], [(m["type"], m["value"]) for m in r["metrics"]]) for r in index["results"]] == \
        [("synthetic", [("em", 5.0), ("f1", 10.0)])]
    assert "| mask_trained | synthetic | 40 | 5.00 [0.00, 10.00] | 10.00 [8.00, 12.00] | 5.00 [0.00, 10.00] |" in card
    assert "| mask_trained vs mask | synthetic | 40 | +1.00 [0.00, 2.00] | **+7.00 [6.00, 8.00]** † |" in card
    assert "| mask | synthetic |" not in card                      # a row on the base model is no score of these
    assert "see reports/eval.md" not in card and "## Data\n\n| name | rows |" in card    # pointer replaced, rest kept

    commit_run(repo, 2, "train_joint_mask")                          # retrained, evaluate not rerun
    register(repo, "mask-agent", "v0.0.2")
    stale = tmp_path / "release-2"
    with pytest.raises(RegistryError, match=r"evaluate's records .* changed since it ran: models/agents \(modified\)"
                                            r"; run `dvc repro evaluate`"):
        get_release(repo, "mask-agent", "v0.0.2", stale)
    assert not stale.exists() and not list(tmp_path.glob(".release-2.*"))
    get_release(repo, "mask-agent", "v0.0.2", stale, evaluation=False)
    assert (stale / "weights.txt").read_text() == "2"
    assert "fetched without evaluation" in (stale / "README.md").read_text()
    assert "model-index" not in front_matter((stale / "README.md").read_text())

    commit_run(repo, 2, "evaluate")                                  # evaluated: a new version gets its numbers
    register(repo, "mask-agent", "v0.0.3")
    got = get_release(repo, "mask-agent", "v0.0.3", tmp_path / "release-3")
    assert "| mask_trained | synthetic | 40 | 10.00 [0.00, 20.00] | 20.00 [18.00, 22.00] |" in \
        (got / "README.md").read_text()

    (repo / "params.yaml").write_text(release_params(2, n=41))       # a param of evaluate moved after it ran
    run(["git", "commit", "-q", "-am", "n 41"], repo)
    register(repo, "mask-agent", "v0.0.4")
    with pytest.raises(RegistryError, match=r"changed since it ran: params.yaml:eval"):
        get_release(repo, "mask-agent", "v0.0.4", tmp_path / "release-4")
    done = subprocess.run([sys.executable, "-m", "ragteam.cli", "registry", "get", "mask-agent", "v0.0.4", "--repo",
                           str(repo), "-o", str(tmp_path / "release-4")], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.startswith("ERROR mask-agent@v0.0.4: evaluate's records") \
        and "Traceback" not in done.stderr
    with pytest.raises(RegistryError, match="already exists"):
        get_release(repo, "mask-agent", "v0.0.3", got)


def test_the_rows_and_records_of_the_real_pipeline_that_a_release_card_shows():
    """Against the project's own params.yaml and records: which rows read each agent directory, and the card's
    lines carry the recorded numbers."""
    import json

    import yaml

    from ragteam.release import evaluation_section, reading_rows

    root = Path(__file__).resolve().parents[1]
    params = yaml.safe_load((root / "params.yaml").read_text())
    assert reading_rows(params, "models/agents/mask") == {"evaluate": ["mask_trained"], "evaluate_agents": []}
    assert reading_rows(params, "models/warmup/mask") == {"evaluate": ["mask_warmup"], "evaluate_agents": []}
    answer = reading_rows(params, "models/agents/answer")
    assert answer["evaluate_agents"] == ["answer"]
    assert "maps" in answer["evaluate"] and "maps_base_answer" not in answer["evaluate"]
    assert "maps_untrained" not in answer["evaluate"]
    records = {p: json.loads((root / p).read_text()) for p in
               ("metrics/eval.json", "metrics/eval_compare.json", "metrics/eval_agents.json")}
    lines, results = evaluation_section(records, {"evaluate": ["mask_trained"], "evaluate_agents": []})
    m = records["metrics/eval.json"]["mask_trained"]["synthetic"]
    assert any(line.startswith(f"| mask_trained | synthetic | {m['n']:.0f} |") and f"{m['f1']:.2f} [" in line
               for line in lines)
    assert any(line.startswith("| mask_trained vs mask |") for line in lines)
    assert any(line.startswith("| mask_trained vs mask_warmup |") for line in lines)
    lines, results = evaluation_section(records, {"evaluate": [], "evaluate_agents": ["answer"]})
    f1 = records["metrics/eval_agents.json"]["synthetic"]["answer"]["trained"]["f1"]
    assert any(line.startswith("| F1 | synthetic |") and f"{f1:.2f} [" in line for line in lines)
    assert {"type": "f1", "value": f1, "name": "F1 (answer agent)"} in [m for r in results for m in r["metrics"]]
