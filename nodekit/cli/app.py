"""Placeholder app; replaced by the full CLI."""

import typer

app = typer.Typer()


def main() -> None:
    app()
