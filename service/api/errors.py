"""How the API answers bad input: 422s that name the bad value and what is accepted."""

from __future__ import annotations

from fastapi import FastAPI


def install_error_handlers(app: FastAPI) -> None:
    """Register the request-validation handlers on `app`."""
