"""How the API answers bad input: 422s that name the bad value and what is accepted.

The body is pydantic's error list (type, loc, msg, input, ctx), kept small and renderable
whatever came in: `input` is cut to INPUT_CHARS characters (a container is shown as a short
repr), text is cut to TEXT_CHARS, unpaired surrogates are written as `\\udfcc` escapes, NaN and
±Infinity (which Python's json parses, 1e400 included) become the strings "NaN", "Infinity",
"-Infinity", and at most MAX_ERRORS errors are listed. A body that is not UTF-8, or that
json.loads refuses with something other than a JSONDecodeError (an integer of over 4300
digits, nesting too deep), is a 422 `json_invalid` as well, where FastAPI would answer 400.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

INPUT_CHARS = 100
TEXT_CHARS = 1000
MAX_ERRORS = 20
FASTAPI_BODY_PARSE_ERROR = "There was an error parsing the body"
"""The detail of the 400 FastAPI raises when reading the JSON body fails (not a JSONDecodeError)."""

_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
_SHORT_REPR = reprlib.Repr()  # keyword arguments need Python 3.12
for _limit, _value in {"maxlevel": 2, "maxdict": 4, "maxlist": 4, "maxtuple": 4, "maxset": 4,
                       "maxstring": 40, "maxother": 40}.items():
    setattr(_SHORT_REPR, _limit, _value)


def install_error_handlers(app: FastAPI) -> None:
    """Register the request-validation handlers on `app`."""
    app.add_exception_handler(RequestValidationError, request_validation_error)
    app.add_exception_handler(StarletteHTTPException, unparsable_body_is_422)


async def request_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with the errors, each cut to a size the response can carry (safe_errors)."""
    return JSONResponse({"detail": safe_errors(exc.errors())}, status_code=422)


async def unparsable_body_is_422(request: Request, exc: StarletteHTTPException):
    """FastAPI's 400 for a body json.loads could not read becomes a 422 naming why; any other
    HTTP error is answered as FastAPI does."""
    cause = exc.__cause__
    if (exc.status_code == 400 and exc.detail == FASTAPI_BODY_PARSE_ERROR
            and isinstance(cause, ValueError | RecursionError)):
        what = ("not UTF-8" if isinstance(cause, UnicodeDecodeError) else "not JSON that can be "
                "read (integers of at most 4300 digits, nesting at most ~1000 deep)")
        return JSONResponse({"detail": [{
            "type": "json_invalid", "loc": ["body"], "msg": f"the body is {what}",
            "ctx": {"error": _text(f"{type(cause).__name__}: {cause}", TEXT_CHARS)}}]},
            status_code=422)
    return await http_exception_handler(request, exc)


def safe_errors(errors: Sequence[dict]) -> list[dict]:
    """pydantic errors as JSON-safe dicts of bounded size; the first MAX_ERRORS of them, then
    one `too_many_errors` item counting the rest."""
    shown = [_safe_error(error) for error in errors[:MAX_ERRORS]]
    if len(errors) > MAX_ERRORS:
        shown.append({"type": "too_many_errors", "loc": [],
                      "msg": f"{len(errors) - MAX_ERRORS} more errors not listed",
                      "ctx": {"errors": len(errors), "listed": MAX_ERRORS}})
    return shown


def _safe_error(error: dict) -> dict:
    safe = {"type": str(error.get("type", "value_error")),
            "loc": [_safe_value(part, TEXT_CHARS) for part in error.get("loc", ())],
            "msg": _text(str(error.get("msg", "")), TEXT_CHARS)}
    if "input" in error:
        safe["input"] = _safe_value(error["input"], INPUT_CHARS)
    if error.get("ctx"):
        safe["ctx"] = {str(k): _safe_value(v, TEXT_CHARS) for k, v in error["ctx"].items()}
    return safe


def _safe_value(value, limit: int):
    """`value` as JSON can carry it in at most about `limit` characters."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else _NON_FINITE[repr(value)]
    if isinstance(value, int):
        return value if value.bit_length() <= 64 else _text(str(value), limit)
    if isinstance(value, str):
        return _text(value, limit)
    if isinstance(value, BaseException):
        return _text(str(value), limit)
    return _text(_SHORT_REPR.repr(value), limit)


def _text(text: str, limit: int) -> str:
    """`text` cut to `limit` characters (saying how long it was), lone surrogates escaped."""
    if len(text) > limit:
        text = f"{text[:limit]}… ({len(text)} characters)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
