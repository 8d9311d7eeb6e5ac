"""`python -m worldsmith.cli`: the `worldsmith` command."""

from worldsmith.cli import app

app(prog_name="worldsmith")
