"""The error a client caused or must handle (ApiError), as every API of the server raises it; endpoint.py
renders it as the API's JSON body (OpenAI's, or the Ollama or Anthropic body below). request_error turns
the front-end's verdict on a prompt into one.
Importing this loads nothing else of the server."""

from __future__ import annotations

from typing import Any

from edgellm.engine.checks import PromptTooLongError, TokenIdError


class ApiError(Exception):
    """An error the client caused or must handle, rendered as OpenAI's {"error": {...}} body."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# Anthropic's error types by status (its API reference, "Errors").
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
}  # fmt: skip


def ollama_error_body(e: ApiError) -> dict[str, Any]:
    return {"error": e.message}


def anthropic_error_body(e: ApiError) -> dict[str, Any]:
    kind = ANTHROPIC_ERROR_TYPES.get(e.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}


def bad_value(param: str, message: str) -> ApiError:
    return ApiError(400, f"'{param}': {message}", param=param, code="invalid_value")


def request_error(e: ValueError, n_ctx: int, chat: bool) -> ApiError:
    """The front-end's verdict on a request (LLM.make_request) as the API's 400: the context-length body
    OpenAI sends, a token id outside the vocabulary naming the field that had it."""
    what = "messages" if chat else "prompt"
    if isinstance(e, PromptTooLongError):
        return ApiError(
            400,
            f"This model's maximum context length is {n_ctx} tokens. However, your {what} resulted in "
            f"{e.count} tokens (at most {n_ctx - 1} prompt tokens leave room for one generated token).",
            param=what,
            code="context_length_exceeded",
        )
    if isinstance(e, TokenIdError):
        last = e.vocab_size - 1
        if e.field == "logit_bias":
            return bad_value("logit_bias", f"token id {e.token_id} is outside the vocabulary (0..{last})")
        if not chat:  # a completion's prompt given as token ids
            return bad_value("prompt", f"token ids must be in 0..{last}")
    return ApiError(400, str(e), param=what)
