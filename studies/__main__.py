from studies.cli import app

app(prog_name="python -m studies")
