"""OpenAI-style error bodies for every failure the HTTP server reports.

Every 4xx/5xx answer has the body `{"error": {"message", "type", "param", "code"}}`, whatever
raised it: our own `ApiError`, FastAPI's request validation, Starlette's 404/405, or a bug.
"""

from __future__ import annotations

import logging
import re
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
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

FASTAPI_BODY_PARSE_ERROR = "There was an error parsing the body"
# pydantic error types for a body that is valid JSON but not an object (or not JSON-typed)
NOT_AN_OBJECT_ERRORS = frozenset({"model_attributes_type", "model_type", "dict_type"})


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """The body of every error answer (documented in the OpenAPI schema)."""

    error: ErrorDetail


ERROR_DESCRIPTIONS = {
    400: "Invalid request: bad JSON, a parameter out of range or unsupported (param names it), "
         "a prompt too long for the context, token ids outside the vocabulary",
    401: "Missing or wrong API key (only with --api-key)",
    404: "The model is not the one this server serves",
    413: "The request body is larger than --max-request-body-mb",
    500: "The engine could not run this request (the server keeps running)",
    503: "The engine is still loading, or the server is shutting down",
}


def documented_errors(*statuses: int) -> dict[int, dict]:
    """`responses=` for a route: the error statuses it can answer, with their body schema."""
    return {s: {"model": ErrorResponse, "description": ERROR_DESCRIPTIONS[s]} for s in statuses}


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
    union_tags = [part for part in location if _is_union_tag(part)]
    location = [part for part in location if not _is_union_tag(part)]
    param = ".".join(location) or None
    if first.get("type") == "lone_surrogate":  # raised on a whole body: ctx names the field
        param = ".".join(filter(None, (param, (first.get("ctx") or {}).get("param")))) or None
    if param is None and first.get("type") == "missing":
        return bad_request("The request body is empty; send a JSON object.", code="invalid_json")
    if param is None and first.get("type") in NOT_AN_OBJECT_ERRORS:
        return bad_request("The request body must be a JSON object "
                           "(sent with Content-Type: application/json).", code="invalid_json")
    message = str(first.get("msg", "Invalid value")).removeprefix("Value error, ")
    if union_tags and first.get("type") != "value_error":  # no member of a Union[...] matched
        tags = [tag for e in errors for tag in _union_tags_at(e, location)]
        message = f"expected one of {', '.join(dict.fromkeys(tags))}"
    if first.get("type") == "missing" and param:
        message = f"Missing required parameter: '{param}'."
    elif param:
        message = f"Invalid value for '{param}': {message}"
    return bad_request(message, param=param, code="invalid_value")


# pydantic puts the member type of a Union in the error location ("prompt", "list[int]")
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|bytes|dict|list)(\[.*\])?$|^function-|\[")


def _is_union_tag(part: str) -> bool:
    return bool(_UNION_TAG.search(part))


def _union_tags_at(error: dict, location: list[str]) -> list[str]:
    parts = [str(part) for part in error.get("loc", ()) if part != "body"]
    if [p for p in parts if not _is_union_tag(p)] != location:
        return []
    return [p for p in parts if _is_union_tag(p)][:1]


async def _handle_http_exception(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    message = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
    if exc.status_code == 404:
        message = f"Not found: {request.method} {request.url.path}"
    if exc.status_code == 400 and message == FASTAPI_BODY_PARSE_ERROR:  # json.loads raised
        return error_response(bad_request(
            "The request body could not be read as JSON: it is not valid UTF-8, nests too "
            "deeply, or holds a number too long to parse.", code="invalid_json"))
    return error_response(ApiError(exc.status_code, message))


async def _handle_unexpected(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("Unhandled error on %s %s", request.method, request.url.path)
    return error_response(ApiError(500, f"Internal server error: {type(exc).__name__}: {exc}",
                                   error_type="server_error"))
