"""The closed sets the API accepts, for the dashboard's create-sweep form."""

from __future__ import annotations

from fastapi import APIRouter

from gdn_core.hardware import ACCELERATOR_TYPES
from gdn_core.presets import PRESETS
from gdn_core.train_config import COMPUTE_DTYPES, PARAM_SHARDINGS, REMATS
from service.api.deps import SettingsDep
from service.db.results_query import SORT_FIELDS
from service.db.schemas import OptionsPublic
from workers.result import TRIAL_STATUSES
from gdn_core.cp_modes import CP_MODES
from workers.grid import TRIAL_MODES
from workers.sweep_spec import FRAMEWORKS, TRIAL_KINDS

router = APIRouter(tags=["options"])


@router.get("/options", response_model=OptionsPublic)
def options(settings: SettingsDep) -> OptionsPublic:
    return OptionsPublic(
        kinds=list(TRIAL_KINDS), frameworks=list(FRAMEWORKS), modes=list(CP_MODES),
        trial_modes=list(TRIAL_MODES), presets=list(PRESETS),
        dtypes=list(COMPUTE_DTYPES), param_shardings=list(PARAM_SHARDINGS),
        remats=list(REMATS), accelerator_kinds=["cpu", "gpu", "tpu"],
        accelerator_types=["cpu", *ACCELERATOR_TYPES], trial_statuses=list(TRIAL_STATUSES),
        result_sort_fields=list(SORT_FIELDS), grid_cap=settings.grid_cap,
        auth_required=bool(settings.api_token), reads_need_token=settings.token_for_reads,
        open_to_network=settings.open_to_network)
