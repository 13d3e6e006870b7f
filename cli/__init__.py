"""The `llmctl` command line: thin Typer commands over library functions."""
