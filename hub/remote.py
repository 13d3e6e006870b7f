"""Everything that asks the Hub something, through huggingface_hub.

huggingface_hub reads HF_ENDPOINT and HF_HUB_OFFLINE once, at import time;
llmctl reads them per call as well, so a long-lived process (the server, the
tests) sees the environment it runs in now."""

from __future__ import annotations

import os
from dataclasses import dataclass

from huggingface_hub import HfApi, constants, get_hf_file_metadata, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from llmctl.errors import HubError
from llmctl.hub.choose import RemoteFile

LOGIN_HINT = "log in with `hf auth login` or set HF_TOKEN"


def endpoint() -> str:
    """The Hub's base URL: HF_ENDPOINT as set now, else huggingface_hub's."""
    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def offline() -> bool:
    """Whether the Hub is off limits: HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as
    set now, else huggingface_hub's setting."""
    raw = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    if raw is None:
        return bool(constants.HF_HUB_OFFLINE)
    return raw.strip().lower() in ("1", "on", "yes", "true")


def token() -> str | None:
    """The Hub token huggingface_hub finds (HF_TOKEN or a login), or None."""
    from huggingface_hub import get_token

    return get_token()


@dataclass
class RepoListing:
    """A repo's files at one commit."""

    repo_id: str
    commit: str
    files: list[RemoteFile]


def hub_error(e: Exception, repo_id: str, what: str = "") -> HubError:
    """One line a user can act on, from whatever huggingface_hub raised."""
    status = getattr(getattr(e, "response", None), "status_code", None)
    where = f"{repo_id}{'/' + what if what else ''}"
    if isinstance(e, GatedRepoError) or status in (401, 403):
        authed = "your token has no access to" if token() else "you are not logged in for"
        return HubError(f"{where}: the repository is gated, private or missing and {authed} "
                        f"it (HTTP {status}); {LOGIN_HINT}, and accept the model's terms on "
                        "its Hub page if it is gated")
    if isinstance(e, RevisionNotFoundError):
        return HubError(f"{repo_id}: revision not found (HTTP {status})")
    if isinstance(e, RepositoryNotFoundError) or status == 404:
        return HubError(f"{where}: not found on {endpoint()} (HTTP {status or 404})")
    if isinstance(e, HfHubHTTPError):
        return HubError(f"{where}: the Hub answered HTTP {status}")
    return HubError(f"{where}: cannot reach {endpoint()}: {type(e).__name__}: {e}")


def list_repo(repo_id: str, revision: str | None) -> RepoListing:
    """Files with sizes and LFS sha256, and the commit the revision names."""
    api = HfApi(endpoint=endpoint(), token=token())
    try:
        info = api.model_info(repo_id, revision=revision, files_metadata=True)
    except Exception as e:  # huggingface_hub raises HTTP and transport errors alike
        raise hub_error(e, repo_id) from e
    files = [RemoteFile(path=s.rfilename, size=s.size or 0,
                        sha256=s.lfs.sha256 if s.lfs else None, blob_id=s.blob_id)
             for s in info.siblings or []]
    if not info.sha:
        raise HubError(f"{repo_id}: the Hub did not say which commit {revision or 'main'} is")
    return RepoListing(repo_id=repo_id, commit=info.sha, files=files)


@dataclass
class FileSource:
    """Where to download one file: the URL after redirects, size, ETag,
    whether Xet serves it, and the headers to send."""

    url: str          # where the bytes are, after the Hub's redirects
    size: int | None
    etag: str | None
    xet: bool         # the Hub serves this file through Xet storage
    headers: dict[str, str]


def file_source(repo_id: str, commit: str, path: str) -> FileSource:
    """Where `path` of `repo_id` at `commit` is served, from the Hub's file
    metadata. Raises HubError (see hub_error) when the Hub refuses or is unreachable."""
    url = hf_hub_url(repo_id, path, revision=commit, endpoint=endpoint())
    tok = token()
    try:
        meta = get_hf_file_metadata(url, token=tok, endpoint=endpoint())
    except Exception as e:
        raise hub_error(e, repo_id, path) from e
    same_host = meta.location.split("/")[2] == url.split("/")[2]
    # Signed CDN URLs must not get the Hub token.
    headers = {"authorization": f"Bearer {tok}"} if tok and same_host else {}
    return FileSource(url=meta.location, size=meta.size, etag=meta.etag,
                      xet=getattr(meta, "xet_file_data", None) is not None, headers=headers)
