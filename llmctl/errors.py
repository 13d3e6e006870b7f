"""Typed errors. The CLI maps each type to an exit code and the server to an
HTTP status, so the mapping lives here, beside the types, and nowhere else."""

from __future__ import annotations


class LlmctlError(Exception):
    """Base class: a user-facing problem with a one-line message."""

    exit_code = 1
    http_status = 500
    error_type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class UsageError(LlmctlError):
    """The user asked for something malformed or impossible."""

    exit_code = 2
    http_status = 400
    error_type = "invalid_request_error"


class InvalidParams(UsageError):
    """A sampling or request parameter is out of range or of the wrong type."""

    code = "invalid_value"


class ContextOverflow(UsageError):
    """The prompt plus the tokens to generate exceed the context."""

    code = "context_length_exceeded"


class ModelNotFound(UsageError):
    """A model reference resolves to nothing."""

    http_status = 404
    code = "model_not_found"


class BadModelFile(UsageError):
    """A file that is not a readable GGUF (or is truncated)."""

    code = "invalid_model_file"


class TemplateError(UsageError):
    """A chat template failed to render or tried to escape the sandbox."""

    code = "invalid_chat_template"


class AuthError(LlmctlError):
    """A missing or wrong API key."""

    exit_code = 3
    http_status = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(LlmctlError):
    """A request from a web origin or Host the server does not trust."""

    exit_code = 3
    http_status = 403
    error_type = "permission_error"
    code = "forbidden"


class QueueFull(LlmctlError):
    """The engine's request queue is full; retry shortly."""

    exit_code = 4
    http_status = 429
    error_type = "rate_limit_error"
    code = "queue_full"


class HubError(LlmctlError):
    """The Hub said no, or the network failed after retries."""

    exit_code = 5
    http_status = 502


class IntegrityError(LlmctlError):
    """Downloaded or cached bytes failed their checksum."""

    exit_code = 6


class DiskSpaceError(LlmctlError):
    """Not enough free disk space for what is about to be written."""

    exit_code = 7
    http_status = 507
    error_type = "insufficient_storage"


class PayloadTooLarge(UsageError):
    """A request body or prompt over the server's configured limit."""

    http_status = 413
    code = "payload_too_large"


class PathEscape(LlmctlError):
    """A name from outside (a Hub listing, a cache file, a request) would
    leave the folder it belongs in."""

    exit_code = 6
    http_status = 400
    error_type = "invalid_request_error"
    code = "unsafe_path"


class DecodeError(LlmctlError):
    """llama.cpp's llama_decode failed for a batch; `rc` is its return code
    (1: no KV room, the memory left as it was before the call)."""

    rc: int = -1


class EngineFailed(LlmctlError):
    """The engine thread has died; the server cannot generate until restarted."""

    http_status = 503
    error_type = "service_unavailable"
    code = "engine_failed"


class ReplicaLost(LlmctlError):
    """The cluster replica serving a request died before answering; another
    replica can serve it, so the client may retry."""

    http_status = 503
    error_type = "service_unavailable"
    code = "replica_lost"


class ModelLoading(LlmctlError):
    """The server is up but its model is not loaded (yet, or it failed)."""

    http_status = 503
    error_type = "service_unavailable"
    code = "model_loading"


class ModelsBusy(LlmctlError):
    """No loaded model was idle long enough to make room for another one;
    the request may be retried."""

    http_status = 503
    error_type = "service_unavailable"
    code = "models_busy"


class ModelTooLarge(LlmctlError):
    """The model alone needs more memory than the budget allows."""

    exit_code = 7
    http_status = 507
    error_type = "insufficient_storage"
    code = "model_too_large"


class ServeFailed(LlmctlError):
    """`llmctl serve` exited or never became healthy."""


class ServerUnreachable(LlmctlError):
    """Nothing answers at the URL (refused, unknown host, timed out)."""
