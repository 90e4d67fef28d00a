"""``python -m spanmill``: the same as the ``spanmill`` command."""

from spanmill.cli.main import app

app(prog_name="spanmill")
