"""The service itself: health (GET /api/health/live, /ready) and the closed sets the API
accepts (GET /api/options), each list read from the one place that defines it."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel

from gdn_core.config import LAYERS
from gdn_core.cp_layout import LAYOUTS
from gdn_core.cp_modes import ATTN_CP_MODES, CP_MODES
from gdn_core.datasheets import ACCELERATOR_TYPES
from gdn_core.kernels import KERNELS
from gdn_core.presets import PRESETS
from gdn_core.train_config import COMPUTE_DTYPES, FRAMEWORKS, PARAM_SHARDINGS, REMATS
from service.core.config import Settings
from service.db.results_query import SORT_FIELDS
from workers.grid import TRIAL_MODES
from workers.result import TRIAL_STATUSES
from workers.sweep_spec import TRIAL_KINDS, AcceleratorKind


class ComponentHealth(BaseModel):
    ok: bool | None
    """True reachable, False not, None not used by this process (or not connected yet)."""
    detail: str
    """"reachable" / "unreachable (ErrorClass)", the database prefixed with its backend
    (sqlite, postgresql); never an address, path or driver message (those are logged)."""


class HealthPublic(BaseModel):
    """GET /api/health/ready (and /api/health): whether this process can serve sweeps."""

    status: Literal["ok", "unavailable"]
    database: ComponentHealth
    ray: ComponentHealth


class LivenessPublic(BaseModel):
    """GET /api/health/live: the process serves requests."""

    status: Literal["ok"]


class OptionsPublic(BaseModel):
    """What the create-sweep form offers (the same closed sets the API validates against)."""

    kinds: list[str]
    """Trial kinds: measure (run and timed), plan (the JAX step compiled, not run)."""
    frameworks: list[str]
    modes: list[str]
    """CP modes a sweep may ask for."""
    trial_modes: list[str]
    """Modes a trial (and the results filter) may have: the CP modes and "none" (one chip)."""
    presets: list[str]
    dtypes: list[str]
    param_shardings: list[str]
    remats: list[str]
    layers: list[str] = list(LAYERS)
    """Decoders: gdn_only (every layer GDN), hybrid (GDN + gated full attention)."""
    attn_cps: list[str] = list(ATTN_CP_MODES)
    """CP modes of the hybrid's attention layers."""
    layouts: list[str] = list(LAYOUTS)
    """Sequence layouts over the chips."""
    kernels: list[str] = list(KERNELS)
    """Implementations: reference (this project's code), fused (library kernels)."""
    accelerator_kinds: list[str]
    accelerator_types: list[str]
    trial_statuses: list[str]
    result_sort_fields: list[str]
    grid_cap: int
    auth_required: bool
    """Mutating calls need the bearer token."""
    reads_need_token: bool = False
    """Every /api call needs it (GDN_SWEEP_TOKEN_FOR_READS)."""
    open_to_network: bool = False
    """Served beyond loopback with no token (`serve --allow-unauthenticated`): the dashboard
    shows a banner."""

    @classmethod
    def of(cls, settings: Settings) -> OptionsPublic:
        """The closed sets, and what `settings` decide: the grid cap and the token's reach."""
        return cls(
            kinds=list(TRIAL_KINDS), frameworks=list(FRAMEWORKS), modes=list(CP_MODES),
            trial_modes=list(TRIAL_MODES), presets=list(PRESETS), dtypes=list(COMPUTE_DTYPES),
            param_shardings=list(PARAM_SHARDINGS), remats=list(REMATS),
            accelerator_kinds=list(get_args(AcceleratorKind)),
            accelerator_types=["cpu", *ACCELERATOR_TYPES], trial_statuses=list(TRIAL_STATUSES),
            result_sort_fields=list(SORT_FIELDS), grid_cap=settings.grid_cap,
            auth_required=bool(settings.api_token), reads_need_token=settings.token_for_reads,
            open_to_network=settings.open_to_network)
