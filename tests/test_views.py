"""The views a DVC user reaches for (issue 76, ragteam/views): `ragteam experiments` in at most 120 columns with the
default run, the experiment refs and the named studies; `dvc plots show` through `make plots`' template renders with
no network; the DAG by family, whose mermaid copy in docs/pipeline.md cannot go stale."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from ragteam.cli import app
from ragteam.views import dag as views_dag
from ragteam.views import experiments as views_exp
from ragteam.views import plots as views_plots

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 120


def printed(render, view) -> list[str]:
    """What `render(view, console)` prints on a 120-column console, line by line."""
    console = Console(width=WIDTH, record=True, highlight=False, file=open("/dev/null", "w"))
    render(view, console)
    return console.export_text().splitlines()


def assert_fits(lines: list[str]) -> None:
    wide = [line for line in lines if len(line) > WIDTH]
    assert not wide, f"{len(wide)} lines past {WIDTH} columns, e.g. {wide[0]!r}"


STUDY = {"name": "decor-rl-seeds", "dir": "studies/decor_rl_seeds", "question": "Does DECOR's RL beat its warm-up?",
         "headline": "+3.0 F1 [0.0, 8.5] over five RL seeds", "date": "2026-11-20", "commit": "efc5c11",
         "command": "bash studies/rl_seeds.sh decor", "metrics": ["studies/decor_rl_seeds/seeds.json"]}


def study_root(tmp_path: Path, entries) -> Path:
    (tmp_path / "studies/decor_rl_seeds").mkdir(parents=True)
    (tmp_path / "studies/decor_rl_seeds/seeds.json").write_text("{}")
    (tmp_path / "studies/index.yaml").write_text(yaml.safe_dump(entries, sort_keys=False))
    return tmp_path


# ------------------------------------------------------------------------------------------------ ragteam experiments
def test_the_experiment_view_of_this_checkout_fits_120_columns_and_shows_every_system():
    view = views_exp.collect(ROOT)
    lines = printed(views_exp.render, view)
    assert_fits(lines)
    text = "\n".join(lines)
    systems = json.loads((ROOT / "metrics/summary/eval.json").read_text())["systems"]
    assert systems and all(re.search(rf"(?m)^{re.escape(s)}\s", text) for s in systems)
    assert "DVC experiments (refs/exps):" in text
    assert "Named studies" in text
    studies = view["studies"]
    if studies is None:      # studies/index.yaml not written yet: one line says so
        assert [line for line in lines if "Named studies" in line] == ["Named studies: no studies/index.yaml in this "
                                                                       "checkout"]
    else:
        assert studies and all(s["name"][:20] in text for s in studies)


def test_the_named_studies_are_listed_with_their_question_and_headline(tmp_path):
    root = study_root(tmp_path, [STUDY, {**STUDY, "name": "other", "metrics": ["nowhere.json"], "date": "2026-11-21"}])
    view = views_exp.collect(root, with_refs=False)
    assert [s["name"] for s in view["studies"]] == ["decor-rl-seeds", "other"]
    assert view["studies"][0]["missing"] == [] and view["studies"][1]["missing"] == ["nowhere.json"]
    lines = printed(views_exp.render, view)
    assert_fits(lines)
    text = "\n".join(lines)
    assert "Named studies (studies/index.yaml): 2" in text
    assert "Does DECOR's RL beat its warm-up?" in text and "→ +3.0 F1 [0.0, 8.5] over five RL seeds" in text
    assert "missing here: nowhere.json" in text
    assert "no metrics/summary/eval.json" in text          # an empty checkout: the default run says what to do


def test_one_study_shows_its_command_and_its_metrics_values(tmp_path):
    root = study_root(tmp_path, [STUDY])
    (root / "studies/decor_rl_seeds/seeds.json").write_text(json.dumps({"decor": {"f1": {"mean": 14.13, "lo": 9.5}}}))
    done = CliRunner().invoke(app, ["experiments", "--root", str(root), "--study", "decor-rl-seeds"])
    assert done.exit_code == 0, done.output
    assert "bash studies/rl_seeds.sh decor" in done.output and "efc5c11" in done.output
    assert re.search(r"(?m)^decor\.f1\.mean\s+14\.13$", done.output)
    done = CliRunner().invoke(app, ["experiments", "--root", str(root), "--study", "nope"])
    assert done.exit_code == 1
    assert "ERROR studies/index.yaml: no study 'nope' (there are: decor-rl-seeds)" in done.output


def test_a_yaml_date_and_a_studies_mapping_are_read(tmp_path):
    root = study_root(tmp_path, {"studies": [STUDY]})
    (root / "studies/index.yaml").write_text((root / "studies/index.yaml").read_text().replace("'2026-11-20'",
                                                                                               "2026-11-20"))
    assert views_exp.load_studies(root)[0]["date"] == "2026-11-20"


@pytest.mark.parametrize("entries, message", [
    ([STUDY, "just a name"], r"studies/index.yaml: entry 2: expected a mapping"),
    ([{k: v for k, v in STUDY.items() if k != "headline"}], r"entry 1 \(decor-rl-seeds\): missing headline"),
    ([{**STUDY, "commit": 1234567}], r"entry 1 \(decor-rl-seeds\): commit must be a string.*quote it"),
    ([{**STUDY, "metrics": {"a": 1}}], r"entry 1 \(decor-rl-seeds\): metrics must be a list of JSON paths"),
    ([STUDY, STUDY], r"entry 2 \(decor-rl-seeds\): name 'decor-rl-seeds' is also entry 1"),
    ({"name": "x"}, r"studies/index.yaml: expected a list of studies, got dict"),
])
def test_a_malformed_study_index_is_an_error_naming_the_file_and_the_entry(tmp_path, entries, message):
    root = study_root(tmp_path, entries)
    with pytest.raises(views_exp.StudyIndexError, match=message):
        views_exp.load_studies(root)
    done = CliRunner().invoke(app, ["experiments", "--root", str(root), "--no-refs"])
    assert done.exit_code == 1
    assert re.search(message, done.output) and done.output.startswith("ERROR studies/index.yaml: ")


def test_no_study_index_is_one_line_and_the_json_output_parses(tmp_path):
    assert views_exp.load_studies(tmp_path) is None
    done = CliRunner().invoke(app, ["experiments", "--root", str(tmp_path), "--no-refs", "--json"])
    assert done.exit_code == 0, done.output
    view = json.loads(done.output)
    assert view["studies"] is None and view["experiments"] == [] and view["default"]["systems"] == {}


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_dvc_experiment_refs_are_listed_with_their_profile(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "params.yaml").write_text("profile: default\n")
    git(tmp_path, "add", "params.yaml")
    git(tmp_path, "commit", "-qm", "baseline")
    baseline = git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "params.yaml").write_text("profile: paper\n")
    git(tmp_path, "commit", "-qam", "the experiment")
    exp = git(tmp_path, "rev-parse", "HEAD")
    git(tmp_path, "update-ref", f"refs/exps/{baseline[:2]}/{baseline[2:]}/paper-seed0", exp)
    git(tmp_path, "update-ref", "refs/exps/exec/EXEC_HEAD", exp)          # DVC's own bookkeeping: not listed
    refs = views_exp.experiment_refs(tmp_path)
    assert [(r["name"], r["baseline"], r["commit"], r["profile"]) for r in refs] == [
        ("paper-seed0", baseline, exp, "paper")]
    view = views_exp.collect(tmp_path)
    lines = printed(views_exp.render, view)
    assert_fits(lines)
    assert "DVC experiments (refs/exps): 1" in "\n".join(lines)
    assert any(line.startswith("paper-seed0") and exp[:7] in line and baseline[:7] in line for line in lines)


# ------------------------------------------------------------------------------------------------------------- DAG
@pytest.fixture(scope="module")
def dag():
    return views_dag.from_repo(ROOT)


def test_the_dag_in_docs_pipeline_is_what_ragteam_dag_draws_from_dvc_yaml(dag):
    text = (ROOT / "docs/pipeline.md").read_text(encoding="utf-8")
    block = views_dag.docs_block(text)
    assert block is not None, "docs/pipeline.md has no mermaid block under '## The DAG'"
    assert block == views_dag.mermaid(dag), "docs/pipeline.md's DAG is stale: run `ragteam dag --update-docs`"


def test_the_dag_view_fits_120_columns_with_every_stage_in_a_family_and_foreach_stages_collapsed(dag):
    lines = printed(views_dag.render, dag)
    assert_fits(lines)
    assert views_dag.OTHER not in dag.families, f"stages in no family: {dag.families.get(views_dag.OTHER)}"
    assert list(dag.families) == ["data", "indexes", "MAPS agents", "joint systems", "evaluate"]
    systems = yaml.safe_load((ROOT / "params.yaml").read_text())["joint"]["systems"]
    text = "\n".join(lines)
    for stage in ("oracle_traces", "warmup_joint", "train_joint"):
        assert f"{stage}@{{{','.join(systems)}}}" in text
    assert "oracle_traces@{" in text and "(one to one)" in text
    stages, _ = views_dag.dvc_graph(ROOT)
    assert sum(len(m) for m in dag.groups.values()) == len(stages)


def test_the_reduction_keeps_only_arrows_no_longer_path_implies_and_labels_partial_foreach_arrows():
    stages = ["data", "cfg", "index@a", "index@b", "trace@x", "trace@y", "train@x", "train@y", "eval"]
    edges = {("data", "index@a"), ("data", "index@b"), ("index@a", "trace@x"), ("index@a", "trace@y"),
             ("cfg", "trace@y"),
             ("data", "trace@x"), ("trace@x", "train@x"), ("trace@y", "train@y"), ("train@x", "eval"),
             ("train@y", "eval"), ("index@a", "eval"), ("data", "eval")}
    reduced = views_dag.transitive_reduction(stages, edges)
    assert ("data", "trace@x") not in reduced and ("data", "eval") not in reduced and ("index@a", "eval") not in reduced
    d = views_dag.Dag(stages, edges)
    assert d.label("trace") == "trace@{x,y}" and d.label("data") == "data"
    assert d.edge_note("index", "trace") == "a" and d.edge_note("trace", "train") == "one to one"
    assert d.edge_note("train", "eval") == "" and ("index", "eval") not in d.edges
    assert d.edge_note("cfg", "trace") == "for y"
    assert [d.upstream_label(u, "trace") for u in d.upstream("trace")] == ["cfg (for y)", "index@a"]
    assert d.upstream_label("trace", "train") == "trace@{x,y} (one to one)"
    block = views_dag.mermaid(d)
    assert "  index -->|a| trace\n" in block and "  trace -->|one to one| train\n" in block
    assert list(d.families) == ["other"] and 'subgraph family1["other"]' in block   # stages of no family: drawn


def test_update_docs_rewrites_only_the_block_of_its_section(tmp_path):
    doc = tmp_path / "p.md"
    doc.write_text("# t\n\n## The DAG\nprose\n\n```mermaid\nold\n```\n\n## Next\n### The DAG\n```mermaid\nraw\n```\n")
    assert views_dag.update_docs(doc, "```mermaid\nnew\n```\n")
    assert doc.read_text() == ("# t\n\n## The DAG\nprose\n\n```mermaid\nnew\n```\n\n## Next\n### The DAG\n"
                               "```mermaid\nraw\n```\n")
    (tmp_path / "q.md").write_text("## Other\n```mermaid\nx\n```\n")
    assert views_dag.update_docs(tmp_path / "q.md", "y") is False


def test_make_dag_and_make_plots_exist():
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    plots = re.search(r"(?m)^plots:[^\n]*##[^\n]*\n((?:\t[^\n]*\n)+)", make)
    assert plots and "ragteam plots-template build/plots/offline.html" in plots.group(1)
    assert "dvc plots show --html-template build/plots/offline.html" in plots.group(1)
    assert re.search(r"(?m)^dag:[^\n]*##[^\n]*\n(?:\t[^\n]*\n)*\tragteam dag\n", make)
    assert "/dvc_plots/" in (ROOT / ".gitignore").read_text().splitlines()


# ----------------------------------------------------------------------------------------------------------- plots
def test_the_template_inlines_the_bundle_and_keeps_dvcs_placeholder_but_not_its_cdn_scripts():
    page = views_plots.render_template("var x = '</script>'; window.vegaEmbed = function () {};", "V", "1.0")
    assert "{plot_divs}" in page and "{scripts}" not in page           # DVC's CDN <script> tags go into {scripts}
    assert "<\\/script>" in page and "window.vegaEmbed = function" in page
    assert views_plots.network_scripts(page) == []
    with pytest.raises(ValueError, match="placeholder"):
        views_plots.render_template("var s = '{plot_divs}';", "V", "1.0")
    assert views_plots.vega_lite_version(["5.8", "5.21", "5.9", "6.4"]) == "5.21"


def test_network_scripts_finds_cdn_and_protocol_relative_sources_only():
    page = ('<script src="https://cdn.jsdelivr.net/npm/vega@5"></script><script src=//x.org/a.js></script>'
            '<script type="text/javascript">var u = "https://vega.github.io/schema";</script><script src="local.js">')
    assert views_plots.network_scripts(page) == ['<script src="https://cdn.jsdelivr.net/npm/vega@5">',
                                                 "<script src=//x.org/a.js>"]


@pytest.mark.slow
def test_dvc_plots_show_with_the_template_loads_no_script_from_the_network(tmp_path):
    """`make plots` as it runs: the template from vl-convert-python, then `dvc plots show` on this checkout's plots;
    the page's <script> tags reference no http(s) URL and carry the bundle (with node: it defines vegaEmbed)."""
    import vl_convert

    template = tmp_path / "offline.html"
    done = CliRunner().invoke(app, ["plots-template", str(template)])
    assert done.exit_code == 0, done.output
    dvc = Path(sys.executable).parent / "dvc"
    out = tmp_path / "dvc_plots"
    subprocess.run([str(dvc), "plots", "show", "--html-template", str(template), "-o", str(out)], cwd=ROOT,
                   check=True, capture_output=True, text=True, timeout=300)
    html = (out / "index.html").read_text(encoding="utf-8")
    assert views_plots.network_scripts(html) == []
    assert "cdn.jsdelivr.net" not in html
    assert f"vega-embed {vl_convert.get_vega_embed_version()}" in html and "window.vegaEmbed" in html
    assert len(html) > 500_000                                        # the bundle itself, not a reference to it
    assert html.count("vegaEmbed('#") > 0
    node = shutil.which("node")
    if node:      # the inlined script runs on its own and defines vegaEmbed (no DOM needed to load it)
        script = re.search(r'<script type="text/javascript">\n(\(function \(\) \{.*?\}\)\(\);)\n', html, re.S).group(1)
        (tmp_path / "bundle.js").write_text(script)
        check = ("globalThis.window = globalThis; require('vm').runInThisContext("
                 "require('fs').readFileSync(process.argv[1], 'utf8')); console.log(typeof window.vegaEmbed);")
        ran = subprocess.run([node, "-e", check, str(tmp_path / "bundle.js")], capture_output=True, text=True,
                             timeout=120)
        assert ran.stdout.strip() == "function", ran.stderr[-2000:]


# ------------------------------------------------------------------------------------------------------ ragteam times
def test_the_time_view_of_this_checkout_has_every_stage_its_parts_adding_up_in_120_columns():
    from ragteam.lineage import load_stages
    from ragteam.views import times as views_times

    rows = views_times.collect(ROOT / "metrics")
    records = {r.record for r in rows}
    stages = {s.replace("@", "_") for s in load_stages(ROOT)}
    assert stages <= records, f"stages without a timed record: {sorted(stages - records)}"
    assert [r.wall_s for r in rows] == sorted((r.wall_s for r in rows), reverse=True)
    for r in rows:     # ragteam.timing: exclusive phases, `other` the rest, so the parts make the wall time
        assert sum(r.parts.values()) == pytest.approx(r.wall_s, abs=0.05 * r.wall_s + 0.5), r
    lines = printed(views_times.render, rows)
    assert_fits(lines)
    total = views_times.totals(rows)
    assert re.search(rf"all stages\s.*\s{total['wall_s']:.0f}\s", "\n".join(lines))
    md = views_times.markdown(rows).splitlines()
    assert len(md) == len(rows) + 4 and md[-2].startswith("| **all stages** |") and md[-1].startswith("| **share** |")
    assert {line.count("|") for line in md} == {len(views_times.PHASES) + 3}


def test_the_time_view_skips_records_without_a_split_and_names_a_bad_one(tmp_path):
    from ragteam.views import times as views_times

    metrics = tmp_path / "metrics"
    (metrics / "summary").mkdir(parents=True)
    (metrics / "summary/evaluate.json").write_text('{"time_split": "not read: only metrics/*.json are records"}')
    (metrics / "eval.json").write_text('{"native": {"avg": {"f1": 1.0}}}')            # a metric, no stage record
    (metrics / "a.json").write_text(json.dumps({"time_split": {"wall_s": 10.0, "generation_s": 7.0, "other_s": 3.0}}))
    (metrics / "b.json").write_text(json.dumps({"time_split": {"wall_s": 20.0, "training_s": 20.0}}))
    rows = views_times.collect(metrics)
    assert [(r.record, r.wall_s, r.parts["generation"], r.parts["training"]) for r in rows] == [
        ("b", 20.0, 0.0, 20.0), ("a", 10.0, 7.0, 0.0)]
    assert views_times.as_json(rows)["totals"] == {"engine_start_s": 0.0, "generation_s": 7.0, "training_s": 20.0,
                                                   "retrieval_s": 0.0, "other_s": 3.0, "wall_s": 30.0}
    for bad, message in [("{not json", "not a readable JSON record"),
                         ('{"time_split": [1, 2]}', "time_split must map each phase to seconds"),
                         ('{"time_split": {"wall_s": true}}', "time_split must map each phase to seconds"),
                         ('{"time_split": {"generation_s": 1.0}}', "time_split has no wall_s")]:
        (metrics / "c.json").write_text(bad)
        with pytest.raises(views_times.TimesError, match=re.escape(str(metrics / "c.json")) + ".*" + message):
            views_times.collect(metrics)
    result = CliRunner().invoke(app, ["times", "--root", str(tmp_path)])
    assert result.exit_code == 1 and result.output.strip().splitlines() == [
        f"ERROR {metrics / 'c.json'}: time_split has no wall_s (keys: ['generation_s'])"]
    (metrics / "c.json").unlink()
    result = CliRunner().invoke(app, ["times", "--root", str(tmp_path), "--json"])
    assert result.exit_code == 0 and set(json.loads(result.output)["stages"]) == {"a", "b"}
    for empty, message in [(tmp_path / "none", "no such folder"), (tmp_path / "summary-only", "no stage record")]:
        (empty / "metrics").mkdir(parents=True, exist_ok=True) if "summary" in empty.name else None
        with pytest.raises(views_times.TimesError, match=message):
            views_times.collect(empty / "metrics")
