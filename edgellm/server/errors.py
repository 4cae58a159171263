"""The error a client caused or must handle (ApiError), as every API of the server raises it; endpoint.py
renders it as the API's JSON body. Importing this loads nothing else of the server."""

from __future__ import annotations

from typing import Any


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


def bad_value(param: str, message: str) -> ApiError:
    return ApiError(400, f"'{param}': {message}", param=param, code="invalid_value")
