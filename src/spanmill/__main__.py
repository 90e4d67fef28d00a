"""``python -m spanmill``: the same as the ``spanmill`` command."""

from spanmill.cli.main import app

if __name__ == "__main__":
    app(prog_name="spanmill")
