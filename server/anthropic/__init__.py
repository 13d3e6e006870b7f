"""Anthropic's Messages API: translation between its fields and frames and the generation lifecycle."""
