"""`python -m llmctl`: the same entry point as the `llmctl` command."""

from llmctl.cli.app import main

main()
