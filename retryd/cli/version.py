"""``retryd version``."""

from __future__ import annotations

import typer

from retryd import __version__
from retryd.cli.app import app


@app.command()
def version() -> None:
    """Print the retryd version."""
    typer.echo(__version__)
