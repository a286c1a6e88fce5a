"""Errors the API answers with, each an HTTP status and an OpenAI-style JSON error body.

They are TandemErrors: a user caused them and the one-line message says what to change.
"""
from __future__ import annotations

from engine.errors import DoesNotFitError, ModelFileError, TandemError


class APIError(TandemError):
    status = 400
    type = "invalid_request_error"
    code: str | None = None

    def __init__(self, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.type, "param": self.param,
                          "code": self.code}}


class BadRequestError(APIError):
    status = 400


class AuthError(APIError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class ForbiddenError(APIError):
    """The request came through a name or from a page this server does not answer (access.py)."""
    status = 403
    type = "permission_error"


class NotFoundError(APIError):
    status = 404
    code = "not_found"


class TooLargeError(APIError):
    status = 413
    code = "context_length_exceeded"


class UnsupportedMediaError(APIError):
    status = 415
    code = "unsupported_media_type"


class UnavailableError(APIError):
    status = 503
    type = "server_error"
    code = "unavailable"


class InternalError(APIError):
    status = 500
    type = "server_error"
    code = "internal_error"


def as_api_error(exc: BaseException) -> APIError:
    """The API error for any exception a request raised. A TandemError is the user's to fix
    (400, or 413 when something does not fit); anything else is a server fault (500)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, DoesNotFitError):
        return TooLargeError(str(exc))
    if isinstance(exc, ModelFileError):
        # The loaded model cannot serve this kind of request (no chat template, for example).
        return BadRequestError(str(exc), code="model_cannot_serve")
    if isinstance(exc, TandemError):
        return BadRequestError(str(exc))
    return InternalError(f"internal error: {type(exc).__name__}: {exc}")
