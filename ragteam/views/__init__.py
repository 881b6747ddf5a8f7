"""The views a DVC user reaches for, made to fit a screen (issue 76): `ragteam experiments` (the default run, the
experiment refs, the named studies), `ragteam dag` (the stages by family), `ragteam times` (where a run's time went)
and `ragteam plots-template` (the HTML template that lets `dvc plots show` render offline; `make plots`). cli.py only
registers these commands; the modules below import their libraries (rich, dvc, vl_convert) when a command runs."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import typer

WIDTH = 120


def console(width: int | None = None):
    """A rich console at most WIDTH columns wide (the terminal's width when narrower)."""
    from rich.console import Console

    return Console(width=width or min(shutil.get_terminal_size((WIDTH, 24)).columns, WIDTH), highlight=False,
                   soft_wrap=False)


def experiments_cmd(
    as_json: bool = typer.Option(False, "--json", help="print the view as JSON instead"),
    no_refs: bool = typer.Option(False, "--no-refs", help="skip the DVC experiment refs (git) lookup"),
    study: str = typer.Option("", "--study", help="show one named study: its command and its metrics files"),
    root: Path = typer.Option(Path("."), help="the repository"),
) -> None:
    """The default run's key params and headline metrics, the DVC experiment refs, the named studies
    (studies/index.yaml), in at most 120 columns."""
    from ragteam.views.experiments import StudyIndexError, collect, render, render_study, study_detail

    try:
        view = study_detail(root, study) if study else collect(root, with_refs=not no_refs)
    except (StudyIndexError, KeyError) as e:
        typer.echo(f"ERROR {e.args[0] if isinstance(e, KeyError) else e}", err=True)
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps(view, indent=1))
    elif study:
        render_study(view, console())
    else:
        render(view, console())


def dag_cmd(
    mermaid: bool = typer.Option(False, "--mermaid", help="print the mermaid block of docs/pipeline.md instead"),
    update_docs: bool = typer.Option(False, "--update-docs", help="write that block into docs/pipeline.md"),
    root: Path = typer.Option(Path("."), help="the repository"),
) -> None:
    """The DAG of dvc.yaml by family (data, indexes, MAPS agents, joint systems, evaluate), foreach stages collapsed
    and only the arrows no longer path implies, in at most 120 columns."""
    from ragteam.views import dag as views_dag

    graph = views_dag.from_repo(root)
    if update_docs:
        doc = root / "docs/pipeline.md"
        if not views_dag.update_docs(doc, views_dag.mermaid(graph)):
            typer.echo(f"ERROR {doc}: no mermaid block under '{views_dag.DOC_SECTION}'", err=True)
            raise typer.Exit(1)
        typer.echo(f"{doc}: '{views_dag.DOC_SECTION}' updated")
    elif mermaid:
        typer.echo(views_dag.mermaid(graph), nl=False)
    else:
        views_dag.render(graph, console())


def plots_template_cmd(
    out: Path = typer.Argument(Path("build/plots/offline.html"), help="where to write the template"),
) -> None:
    """Write an HTML template for `dvc plots show --html-template` with Vega, Vega-Lite and vega-embed inlined from
    vl-convert-python: the plots render with no network (DVC's own page loads them from a CDN)."""
    from ragteam.views.plots import write_template

    typer.echo(write_template(out))


def times_cmd(
    root: Path = typer.Option(Path("."), help="the run's folder: the checkout, or a scratch run such as .smoke/run"),
    as_markdown: bool = typer.Option(False, "--markdown", help="print the table as markdown instead"),
    as_json: bool = typer.Option(False, "--json", help="print the view as JSON instead"),
) -> None:
    """Where the run's time went: each stage's wall time split into engine start-up, generation, training,
    retrieval and the rest (metrics/<stage>.json), largest first, with each phase's total and share."""
    from ragteam.views.times import TimesError, as_json as times_json, collect, markdown, render

    try:
        rows = collect(root / "metrics")
    except TimesError as e:
        typer.echo(f"ERROR {e}", err=True)
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps(times_json(rows), indent=1))
    elif as_markdown:
        typer.echo(markdown(rows), nl=False)
    else:
        render(rows, console())
