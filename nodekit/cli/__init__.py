"""The command line: typer app, one module per command group; rich is imported only here."""
