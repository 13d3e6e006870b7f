"""The chat page at `/`: static files shipped in the package (static/) and
two small JSON routes the page needs beyond the OpenAI API (routes.py)."""

# Where the page's files are served; the access guard opens these and `/`.
PAGE_PATH = "/"
STATIC_PREFIX = "/webui/static/"
