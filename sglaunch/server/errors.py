"""OpenAI-style error bodies for every failure the HTTP server reports.

Every 4xx/5xx answer has the body `{"error": {"message", "type", "param", "code"}}`, whatever
raised it: our own `ApiError`, FastAPI's request validation, Starlette's 404/405, or a bug.
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    503: "service_unavailable",
}

# pydantic error types for a body that is valid JSON but not an object (or not JSON-typed)
NOT_AN_OBJECT_ERRORS = frozenset({"model_attributes_type", "model_type", "dict_type"})


class ApiError(Exception):
    """An error answered to the client as an OpenAI-style error body."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, error_type: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type or ERROR_TYPES.get(status, "server_error")

    def body(self) -> dict:
        return error_body(self.message, self.error_type, self.param, self.code)


def error_body(message: str, error_type: str, param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(error: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception type FastAPI can raise to an OpenAI-style body."""
    app.add_exception_handler(ApiError, _handle_api_error)
    app.add_exception_handler(RequestValidationError, _handle_validation_error)
    app.add_exception_handler(StarletteHTTPException, _handle_http_exception)
    app.add_exception_handler(Exception, _handle_unexpected)


async def _handle_api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc)


async def _handle_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(validation_error(exc.errors()))


def validation_error(errors: list[dict] | tuple) -> ApiError:
    """The first pydantic error as a 400 naming the offending parameter."""
    if not errors:
        return bad_request("Invalid request.")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return bad_request(f"Request body is not valid JSON: {first.get('msg')}", code="invalid_json")
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(location) or None
    if first.get("type") == "lone_surrogate":  # raised on a whole body: ctx names the field
        param = ".".join(filter(None, (param, (first.get("ctx") or {}).get("param")))) or None
    if param is None and first.get("type") == "missing":
        return bad_request("The request body is empty; send a JSON object.", code="invalid_json")
    if param is None and first.get("type") in NOT_AN_OBJECT_ERRORS:
        return bad_request("The request body must be a JSON object "
                           "(sent with Content-Type: application/json).", code="invalid_json")
    message = str(first.get("msg", "Invalid value")).removeprefix("Value error, ")
    if first.get("type") == "missing" and param:
        message = f"Missing required parameter: '{param}'."
    elif param:
        message = f"Invalid value for '{param}': {message}"
    return bad_request(message, param=param, code="invalid_value")


async def _handle_http_exception(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    message = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
    if exc.status_code == 404:
        message = f"Not found: {request.method} {request.url.path}"
    return error_response(ApiError(exc.status_code, message))


async def _handle_unexpected(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("Unhandled error on %s %s", request.method, request.url.path)
    return error_response(ApiError(500, f"Internal server error: {type(exc).__name__}: {exc}",
                                   error_type="server_error"))
