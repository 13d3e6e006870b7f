"""Print docs/configuration.md's table of the settings without a flag, from
their one definition (llmctl/settings.py's VARS); tests/test_settings.py
checks that the page holds it.

    .venv/bin/python scripts/settings_table.py
"""

from __future__ import annotations

from llmctl.settings import markdown_table

if __name__ == "__main__":
    print(markdown_table(), end="")
