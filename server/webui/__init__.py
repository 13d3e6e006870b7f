"""The chat page at `/`: static files shipped in the package (static/) and
two small JSON routes the page needs beyond the OpenAI API (routes.py)."""
