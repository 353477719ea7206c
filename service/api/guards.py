"""The API's perimeter: request size, Host and Origin checks, security headers, 503s."""

from __future__ import annotations

from fastapi import FastAPI

from ..core.config import Settings


def install_guards(app: FastAPI, settings: Settings) -> None:
    """Register the perimeter middleware and handlers on `app`."""
