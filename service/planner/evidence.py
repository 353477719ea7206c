"""The trial results a plan rests on: succeeded rows of `results`, measured and compiled."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from gdn_core.cp_modes import gdn_mode
from gdn_core.datasheets import canonical_accelerator_type
from gdn_core.packing import SINGLE_DOCUMENT
from service.db.interpreted import INTERPRETED_NOTE, ran_interpreted
from service.db.models import Result
from service.schemas.planner import Figure


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Observation:
    """One succeeded trial, as the fits read it."""

    trial_id: int
    sweep_id: int
    kind: str
    framework: str
    mode: str
    """A CP mode, or "none" (one chip)."""
    kernels: str
    chips: int
    """All chips of the trial's mesh (dp replicas × CP chips)."""
    seq_len: int
    batch_size: int
    """Sequences per replica."""
    dp: int = 1
    """Data-parallel replicas. The link fits read measured trials of every mesh
    (fits.link_rows); the other fits see dp 1 trials only. A dp > 1 trial is evidence for
    exactly its own mesh (capacity._mesh_figures); other meshes are predicted from their
    replica (planner.meshes)."""
    preset: str
    num_layers: int
    dtype: str
    param_sharding: str
    remat: str
    accelerator_type: str
    step_time_s: float | None
    hardware_flops_per_step: float | None
    peak_flops_per_chip: float | None
    memory_bytes: int | None
    """What memory fits read (memory_of): a device's measured peak, or XLA's estimate."""
    memory_source: str | None
    memory_is_peak: bool
    """memory_bytes is a device's measured peak (else XLA's estimate, or None)."""
    peak_memory_bytes: int | None
    """The measured peak as recorded (RSS on CPU hosts included), for plan checks."""
    peak_memory_source: str | None
    predicted_memory_bytes: int | None
    cp_comm_bytes: int | None
    grad_sync_bytes: int | None
    interpreted: bool = False
    """It ran a kernel through its interpreter: no evidence of speed or memory (split_speed)."""
    layers: str = "gdn_only"
    """The decoder it trained: gdn_only, or the hybrid."""
    attn_cp: str | None = None
    """The hybrid's attention CP mode (None: gdn_only, or no CP)."""
    layout: str = "contiguous"

    @property
    def local_tokens(self) -> int:
        """Tokens of one chip's shard (batch per replica × seq_len ÷ a replica's CP chips,
        chips ÷ dp)."""
        return self.batch_size * self.seq_len // (self.chips // self.dp)

    @property
    def cp_chips(self) -> int:
        """Chips of one replica's CP group: chips ÷ dp."""
        return self.chips // self.dp

    @property
    def cp_mode(self) -> str:
        """The GDN mode gdn_core ran (a baseline's "none" as cp_modes.gdn_mode names it)."""
        return gdn_mode(self.mode)

    def settings(self) -> tuple:
        """What a fit may not mix: the model and its decoder, batch, replicas, dtype and step
        settings, the framework and its kernels, the attention's CP mode and the layout."""
        return (self.preset, self.num_layers, self.batch_size, self.dp, self.dtype,
                self.param_sharding, self.remat, self.framework, self.kernels, self.layers,
                self.attn_cp, self.layout)


def evidence_for(session: Session, request) -> list[Observation]:
    """The observations a CapacityRequest rests on: none for a shape no trial can be of."""
    if request.custom_shape:
        return []
    return load_observations(session, preset=request.preset,
                             accelerator_type=request.accelerator, sweep_ids=request.sweep_id)


PLANNED_DOCUMENTS = SINGLE_DOCUMENT
"""How the planner's answers pack sequences: one document each (its requests name no
packing), so trials on packed documents, whose attention is other work, are not fitted."""


def load_observations(session: Session, *, preset: str, accelerator_type: str,
                      sweep_ids: list[int] | None = None) -> list[Observation]:
    """Succeeded single-document (PLANNED_DOCUMENTS) trials of `preset`: measured ones on
    `accelerator_type` (canonical, as CapacityRequest has it), and every plan (a compile is
    XLA:CPU's wherever it ran; its estimate is labelled so). Interpreted runs come flagged:
    what fits reads them through split_speed, which leaves them out."""
    stmt = select(*_COLUMNS).where(Result.status == "succeeded", Result.preset == preset,
                                   Result.documents == PLANNED_DOCUMENTS)
    if sweep_ids:
        stmt = stmt.where(Result.sweep_id.in_(sweep_ids))
    rows = session.execute(stmt.order_by(Result.trial_id)).all()  # plain rows, no ORM objects
    return [observation(r, chip=canonical_chip(r.accelerator_type)) for r in rows
            if r.kind == "plan" or canonical_chip(r.accelerator_type) == accelerator_type]


def canonical_chip(accelerator_type: str) -> str:
    """gdn_core.datasheets' name of a chip type as trials spell it (h100 → h100-sxm), cpu as is."""
    try:
        return canonical_accelerator_type(accelerator_type)
    except ValueError:
        return accelerator_type


_COLUMNS = tuple(getattr(Result, name) for name in (
    "trial_id", "sweep_id", "kind", "framework", "kernels", "mode", "chips", "dp", "seq_len",
    "batch_size", "preset", "num_layers", "dtype", "param_sharding", "remat", "accelerator_type",
    "step_time_s", "hardware_flops_per_step", "peak_flops_per_chip",
    "peak_memory_bytes_per_chip", "memory_source", "estimated_memory_bytes_per_chip",
    "estimated_memory_source", "predicted_memory_bytes_per_chip",
    "cp_comm_bytes_per_step_per_chip", "grad_sync_bytes_per_step_per_chip", "gdn_kernel",
    "attention_kernel", "layers", "attn_cp", "layout"))
"""The result columns an Observation reads."""


def memory_of(r) -> tuple[int | None, str | None, bool]:
    """The memory a fit may read of a result: a device allocator's peak (GPU/TPU), else XLA's
    estimate of the compiled step (plans, and JAX trials on CPU hosts). A CPU process's RSS
    mark is no chip's memory — it holds the Python runtime and XLA's compiler too — so it is
    left out."""
    if (r.kind == "measure" and r.peak_memory_bytes_per_chip is not None
            and not (r.memory_source or "").startswith("process_rss")):
        return r.peak_memory_bytes_per_chip, r.memory_source, True
    if r.estimated_memory_bytes_per_chip is not None:
        return r.estimated_memory_bytes_per_chip, r.estimated_memory_source, False
    return None, None, False


def observation(r, *, chip: str) -> Observation:
    """An Observation of a row of `results` (an ORM object or a row of _COLUMNS)."""
    memory, memory_source, is_peak = memory_of(r)
    return Observation(
        trial_id=r.trial_id, sweep_id=r.sweep_id, kind=r.kind, framework=r.framework,
        kernels=r.kernels, mode=r.mode, chips=r.chips, dp=r.dp, seq_len=r.seq_len,
        batch_size=r.batch_size, preset=r.preset,
        num_layers=r.num_layers, dtype=r.dtype, param_sharding=r.param_sharding, remat=r.remat,
        accelerator_type=chip, step_time_s=r.step_time_s,
        hardware_flops_per_step=r.hardware_flops_per_step,
        peak_flops_per_chip=r.peak_flops_per_chip,
        memory_bytes=memory, memory_source=memory_source, memory_is_peak=is_peak,
        peak_memory_bytes=r.peak_memory_bytes_per_chip, peak_memory_source=r.memory_source,
        predicted_memory_bytes=r.predicted_memory_bytes_per_chip,
        cp_comm_bytes=r.cp_comm_bytes_per_step_per_chip,
        grad_sync_bytes=r.grad_sync_bytes_per_step_per_chip,
        interpreted=ran_interpreted(r.gdn_kernel, r.attention_kernel),
        layers=r.layers or "gdn_only", attn_cp=r.attn_cp, layout=r.layout or "contiguous")


def split_speed(observations: Sequence[Observation]
                ) -> tuple[list[Observation], list[Observation]]:
    """(the evidence, the interpreted runs left out of it). An interpreted kernel's step time
    is its interpreter's, and its memory the interpreter's buffers (numpy arrays of every
    block, XLA's lowering of a Pallas interpreter loop), not the kernel's: neither figure is
    fitted. They are loaded all the same, so an answer can say why it lacks them."""
    return ([o for o in observations if not o.interpreted],
            [o for o in observations if o.interpreted])


def interpreted_note(interpreted: Sequence[Observation], what: str = "") -> str:
    """Why `interpreted` (trials a figure or an answer would have rested on) were not used."""
    shown = sorted({o.trial_id for o in interpreted})
    ids = ", ".join(map(str, shown[:6])) + (f" and {len(shown) - 6} more"
                                            if len(shown) > 6 else "")
    return (f"{INTERPRETED_NOTE}: trial{'s' if len(shown) > 1 else ''} {ids} "
            f"ran interpreted (GDN_SWEEP_INTERPRET_KERNELS=1): {what or 'no evidence'}")


def interpreted_caveat(interpreted: Sequence[Observation]) -> str:
    """An answer's caveat naming the interpreted trials of its request it left out."""
    return interpreted_note(interpreted, "none of their figures is evidence here: the step "
                                         "time is the interpreter's, and so is the memory (its "
                                         "buffers, not the kernel's)")


def say_left_out(left_out: Sequence[Observation], memory: Figure, step: Figure
                 ) -> tuple[Figure, Figure]:
    """A candidate's memory and step, each saying that the interpreted trials of its settings
    (`left_out`) were not used, where it rests on no trial of exactly the point."""
    def said(figure: Figure, what: str) -> Figure:
        if figure.basis in ("measured", "estimated"):
            return figure
        note = "; ".join(filter(None, (figure.note, interpreted_note(left_out, what))))
        return figure.model_copy(update={"note": note})

    return (said(memory, "their memory is the interpreter's, not the kernel's"),
            said(step, "their step time is no speed"))
