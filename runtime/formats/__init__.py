"""Chat formats in pure Python: templates, tools, grammars, reasoning."""
