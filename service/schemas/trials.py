"""A trial and its outcome (GET /api/trials/{id}, the trial listings of a sweep and of GET
/api/results), its attempts and profile, and the environments trials measured in (GET
/api/environments)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, model_validator

from gdn_core.kernels import DEFAULT_KERNELS
from gdn_core.packing import SINGLE_DOCUMENT
from service.core.environment_diff import EnvironmentChange
from service.db.crud import TrialRow
from service.db.interpreted import ran_interpreted
from service.schemas.utc import UTCDatetime
from workers.result import ProfileStatus, TrialMetrics, scaling_efficiency, speedup_vs_one_chip


class AttemptPublic(BaseModel):
    """One attempt of a trial (a row of trial_attempts)."""

    attempt: int
    status: str
    reason: str | None = None
    hosts: list[str] = []
    started_at: UTCDatetime | None = None
    finished_at: UTCDatetime | None = None


class ProfilePublic(BaseModel):
    """A profiled trial's extra step (SweepSpec.profile): where its trace is served, and what
    it says. The step ran after the measured ones: no metric includes it."""

    url: str | None = None
    """GET it for the trace file (None when the profiler failed: see error)."""
    bytes: int | None = None
    format: str
    """chrome_trace_json_gz (torch: Perfetto / chrome://tracing / TensorBoard) or
    xprof_run_tar_gz (JAX: a TensorBoard profile run; `xprof --logdir` after unpacking)."""
    summary: dict = {}
    """wall_s, busy_s, idle_s, compute_s, collective_s (seconds of the profiled step) and
    top_ops [{name, category, self_s, count}] by self time (workers.profile_summary)."""
    error: str | None = None
    status: ProfileStatus = "stored"
    """stored; failed (the profiler failed); skipped (taken, but the artifact directory had
    no room within its retention limits: error says which)."""


class _TrialOutcome(BaseModel):
    """A trial as its row holds it, and its result's outcome: TrialPublic less the metrics."""

    id: int
    sweep_id: int
    key: str
    kind: str = "measure"
    """measure (run and timed) or plan (the JAX step compiled for the chips, not run: XLA's
    memory estimate, compiled FLOPs and collective bytes; no step time, MFU or peak)."""
    framework: str
    mode: str
    """A CP mode, or "none": the one-chip baseline (chips=1) every mode's rows refer to."""
    chips: int
    """All chips of the trial's mesh: dp replicas × chips / dp CP chips."""
    dp: int = 1
    """Data-parallel replicas; each holds chips / dp chips that split its sequences (CP)."""
    seq_len: int
    repeat: int = 0
    """Which run of its grid point (0 … the sweep's repeats − 1)."""
    baseline_key: str | None = None
    """chips > 1: key of the one-chip trial of the same framework, seq_len, settings, repeat."""
    baseline_trial_id: int | None = None
    speedup_vs_one_chip: float | None = None
    """tokens/s of the whole trial ÷ tokens/s of its one-chip baseline (both succeeded)."""
    scaling_efficiency: float | None = None
    """tokens/s/chip ÷ the baseline's tokens/s/chip: 1 is perfect scaling."""
    batch_size: int
    """batch_size per replica: the sequences one data-parallel replica trains each step."""
    global_batch_size: int = 0
    """Sequences per step over all replicas: dp × batch_size (derived, never stored)."""
    preset: str
    num_layers: int
    vocab_size: int
    dtype: str
    param_sharding: str
    remat: str
    layers: str = "gdn_only"
    """The decoder it trained: gdn_only (every layer GDN) or hybrid (GDN + gated attention)."""
    attn_cp: str | None = None
    """The hybrid's attention CP mode; None: no attention layers, or one chip."""
    layout: str = "contiguous"
    """Which tokens each chip held: contiguous or zigzag."""
    kernels: str = DEFAULT_KERNELS
    """reference (this project's code) or fused (library kernels); what they resolved to is
    in gdn_kernel and attention_kernel."""
    documents: str = SINGLE_DOCUMENT
    """How each sequence was packed: single, or uniform:LO-HI (documents of LO … HI tokens;
    attention and the GDN state restart at each boundary). Model FLOPs and MFU count
    attention per document."""
    interpreted: bool = False
    """A kernel ran through its interpreter (its name ends " (interpreted)"; derived, never
    stored): a correctness run, whose step time, tokens/s/chip, MFU and HFU are no speed."""
    steps: int
    warmup_steps: int
    accelerator: str
    """Chip type (cpu, h100, v5p, …)."""
    accelerator_kind: str
    verify: bool
    timeout_s: float
    status: str
    error: str | None = None
    attempts: int | None = None
    attempt_history: list[AttemptPublic] = []
    """Every attempt in order (empty until the trial ends, and for results stored before the
    history was kept); the last one is the outcome."""
    hosts: list[str] | None = None
    versions: dict[str, str] | None = None
    environment_id: int | None = None
    """The environment it measured in (GET /api/environments/{id}); None before it ran, for
    trials no worker process ran, and for results stored before environments were kept."""
    profile: ProfilePublic | None = None
    """Set when the trial ran with profile: true (None otherwise)."""
    created_at: UTCDatetime
    started_at: UTCDatetime | None = None
    finished_at: UTCDatetime | None = None

    @model_validator(mode="after")
    def _global_batch_of_every_replica(self) -> "_TrialOutcome":
        self.global_batch_size = self.dp * self.batch_size
        return self


class TrialPublic(TrialMetrics, _TrialOutcome):
    """A trial and its outcome, then its metrics: every field of TrialMetrics (workers/result.py,
    the one list of metrics). Pydantic takes the last base's fields first, so JSON objects and
    CSV rows start with the trial's."""

    model_config = ConfigDict(extra="ignore")  # TrialMetrics forbids extras; rows carry joins

    @model_validator(mode="after")
    def _interpreted_from_kernel_names(self) -> "TrialPublic":
        self.interpreted = ran_interpreted(self.gdn_kernel, self.attention_kernel)
        return self

    @classmethod
    def from_rows(cls, rows: Iterable[TrialRow]) -> list[TrialPublic]:
        """TrialPublic of each of crud's TrialRows (crud.public_trials, list_trials,
        get_trial), validated as one list (listings of thousands stay fast)."""
        return _TRIALS.validate_python([_fields(row) for row in rows])

    @classmethod
    def from_row(cls, row: TrialRow) -> TrialPublic:
        """TrialPublic of one of crud's TrialRows."""
        return cls.model_validate(_fields(row))


_TRIALS = TypeAdapter(list[TrialPublic])


def _fields(row: TrialRow) -> dict[str, Any]:
    """TrialPublic's fields from a TrialRow: the result's start time over the trial's, the
    skip reason as a skipped trial's error, the ratios to the one-chip baseline (succeeded,
    compiled trials only: workers.result derives them), the attempts and the profile."""
    data = dict(row.columns)
    data["accelerator"] = data.pop("accelerator_type")
    skip_reason = data.pop("skip_reason", None)
    started = data.pop("result_started_at", None)
    if started is not None:
        data["started_at"] = started
    if data.get("error") is None and data["status"] == "skipped":
        data["error"] = skip_reason
    baseline = data.pop("baseline_tokens_per_s_per_chip", None)
    mine = data.get("tokens_per_s_per_chip")
    if (baseline and mine is not None and data["status"] == "succeeded"
            and not ran_interpreted(data.get("gdn_kernel"), data.get("attention_kernel"))):
        data["scaling_efficiency"] = scaling_efficiency(mine, baseline)
        data["speedup_vs_one_chip"] = speedup_vs_one_chip(mine, data["chips"], baseline)
    data["attempt_history"] = row.attempts
    data["profile"] = _profile(data)
    return data


def _profile(data: dict) -> dict | None:
    """ProfilePublic's fields from a row's profile_* columns (popped), or None."""
    fmt, path = data.pop("profile_format", None), data.pop("profile_path", None)
    values = dict(format=fmt, bytes=data.pop("profile_bytes", None),
                  summary=data.pop("profile_summary", None) or {},
                  error=data.pop("profile_error", None),
                  status=data.pop("profile_status", None) or ("stored" if path else "failed"),
                  url=None if path is None else f"/api/trials/{data['id']}/profile")
    return None if fmt is None else values


class TrialDetailPublic(TrialPublic):
    """GET /api/trials/{id}: the trial, its metrics, and its environment's body."""

    environment: dict[str, Any] | None = None
    """What the trial measured in (workers.environment: python, packages, project, runtime,
    accelerator, source); None when environment_id is."""


class TrialsPublic(BaseModel):
    data: list[TrialPublic]
    count: int


class EnvironmentPublic(BaseModel):
    """GET /api/environments/{id}: one distinct environment, as stored once."""

    id: int
    content_hash: str
    body: dict[str, Any]
    created_at: UTCDatetime


class TrialEnvironmentRef(BaseModel):
    trial_id: int
    environment_id: int


class EnvironmentDiffPublic(BaseModel):
    """GET /api/environments/diff?a=&b=: what changed from trial a's environment to b's."""

    a: TrialEnvironmentRef
    b: TrialEnvironmentRef
    same: bool
    """Both trials measured in one stored environment (then `changes` is empty)."""
    changes: list[EnvironmentChange]
    """Leaves that differ, by dotted key (service.core.environment_diff)."""
