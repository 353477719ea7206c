"""The closed sets the API accepts, for the dashboard's create-sweep form."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import SettingsDep
from service.schemas.system import OptionsPublic

router = APIRouter(tags=["options"])


@router.get("/options", response_model=OptionsPublic)
def options(settings: SettingsDep) -> OptionsPublic:
    return OptionsPublic.of(settings)
