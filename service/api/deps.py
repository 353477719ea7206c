"""Shared route dependencies as `Annotated` aliases: database session, settings, scheduler,
the results cache, and the bearer token that guards every mutating call when one is
configured."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service.core.config import Settings
from service.db.read_cache import ResponseCache
from service.runs.sweep_queue import Scheduler


def get_db(request: Request) -> Iterator[Session]:
    with request.app.state.session_factory() as session:
        yield session


def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_scheduler(request: Request) -> Scheduler | None:
    return request.app.state.scheduler


def get_results_cache(request: Request) -> ResponseCache:
    return request.app.state.results_cache


SessionDep = Annotated[Session, Depends(get_db)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
SchedulerDep = Annotated[Scheduler | None, Depends(get_scheduler)]
ResultsCacheDep = Annotated[ResponseCache, Depends(get_results_cache)]

_bearer = HTTPBearer(auto_error=False, description="GDN_SWEEP_API_TOKEN, when one is set")


def require_token(settings: SettingsDep, credentials: Annotated[
        HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """401 unless no token is configured or the request carries `Authorization: Bearer <it>`.
    The comparison takes the same time whatever a wrong token shares with the right one
    (secrets.compare_digest), and no answer names either."""
    if not settings.api_token:
        return
    if credentials is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED,
                            "this call needs 'Authorization: Bearer <token>' (the service was "
                            "started with GDN_SWEEP_API_TOKEN)",
                            headers={"WWW-Authenticate": "Bearer"})
    if not secrets.compare_digest(credentials.credentials.encode(), settings.api_token.encode()):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "invalid bearer token",
                            headers={"WWW-Authenticate": "Bearer"})


def require_read_token(settings: SettingsDep, credentials: Annotated[
        HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """require_token on every call when the settings put reads behind the token too."""
    if settings.token_for_reads:
        require_token(settings, credentials)


TokenDep = Depends(require_token)
ReadTokenDep = Depends(require_read_token)
"""On every /api route but health: reads need the token when GDN_SWEEP_TOKEN_FOR_READS."""
