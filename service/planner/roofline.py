"""Speed on chips without trials: a roofline for the fastest a step could be, and an estimate
at a stated efficiency (published_runs.py).

Per chip of a candidate's mesh (dp replicas × cp CP chips), one step:

    roof   = max(compute, HBM, overlapped links) + exposed links + rounds × latency
    compute     hardware FLOPs of the busiest chip ÷ the datasheet peak in the run's dtype
                (gdn_core.flops.executed.hardware_flops_per_step ÷ cp, plus the causal attention a
                ring over contiguous shards leaves on the last chip beyond the mean)
    HBM         the bytes a step must move at least ÷ the datasheet bandwidth: the weights
                read in the compute dtype once per pass (forward, backward, the recomputed
                forward under remat), the float32 gradients written and read, the master
                weights and AdamW state read and written, the kept activations written and
                read (gdn_core.memory.step.predict_step_memory's parts)
    links       bytes received ÷ the chip's link prior (link_priors.link_prior):
                exposed — the GDN mode's exchanges and conv halo, all_gather_kv's forward
                gather, ulysses' all-to-alls (each gates the work after it); overlapped — a
                ring's K/V hops, all_gather_kv's backward reduce-scatter ring, the gradient
                sync (each pipelined behind the work beside it)
    rounds      dependent exchanges (fits.dependent_rounds for the GDN layers, plus the
                exposed attention rounds)

The estimate: the model FLOPs per chip at the efficiency's MFU, never faster than the roof:
    step = max(model FLOPs per chip ÷ (MFU × peak), roof)
so an estimate's MFU is the stated efficiency (less where the roof binds), never above 1.
Virtual CPU chips have neither a datasheet peak nor a published run: no roofline there.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from gdn_core import datasheets
from gdn_core.config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig
from gdn_core.cp_modes import UlyssesHeads
from gdn_core.flops.conventions import FLOPS_PER_MAC, FWD_BWD_MULTIPLIER
from gdn_core.memory.activations import COMPUTE_BYTES, FLOAT32_BYTES
from gdn_core.memory.parameters import param_counts
from gdn_core.train_config import TrainConfig
from service.planner.cached import hardware_flops, model_flops, step_memory
from service.planner.fits import dependent_rounds
from service.planner.link_priors import LinkPrior, link_prior
from service.planner.points import Point
from service.planner.published_runs import Efficiency, efficiency_for
from service.schemas.planner import CapacityRequest, Figure


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CommBytes:
    """Bytes one chip receives per step, by whether they can hide behind other work."""

    exposed: float
    overlapped: float
    cp: float
    """The CP exchanges (GDN and attention), exposed or not."""
    sync: float
    """The weights' traffic: gradient reduction (and fsdp's gathers)."""

    @property
    def total(self) -> float:
        return self.cp + self.sync


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Roofline:
    """The fastest one step could be on a chip type (module docstring), by part."""

    compute_s: float
    hbm_s: float
    overlapped_s: float
    exposed_s: float
    latency_s: float
    comm: CommBytes

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.hbm_s, self.overlapped_s) + self.exposed_s \
            + self.latency_s

    @property
    def bound(self) -> str:
        """What the roof is set by: compute, HBM or links."""
        parts = {"compute": self.compute_s, "HBM": self.hbm_s, "links": self.overlapped_s}
        top = max(parts, key=parts.get)
        return "links" if self.exposed_s + self.latency_s > parts[top] else top


def _passes(remat: str) -> int:
    """Forward, backward, and the recomputed forward under remat."""
    return 2 + (remat != "none")


def _layers(model_cfg: ModelConfig) -> tuple[int, int]:
    pattern = model_cfg.layer_pattern
    return pattern.count(LINEAR_ATTENTION), pattern.count(FULL_ATTENTION)


@functools.lru_cache(maxsize=8192)
def comm_bytes(model_cfg: ModelConfig, point: Point, *, batch: int, seq_len: int, dtype: str,
               framework: str) -> CommBytes:
    """Bytes one chip of `point`'s mesh receives per step: docs/architecture.md's per-mode formulas
    (GDN: p2p one fp32 state, all_gather D − 1 pairs, log_scan ⌈log2 D⌉ pairs, ulysses the
    head shards' q, k, v, g, beta and o; the conv halo; attention as torch_gdn's
    attention_comm_bytes counts it), per layer and pass; the gradient sync over all dp × cp
    chips (ring convention: 2(N − 1)/N of the float32 gradients; fsdp: its gathers in the
    compute dtype, forward and backward, and a float32 reduce-scatter)."""
    gdn_layers, attn_layers = _layers(model_cfg)
    D, B, b = point.cp_chips, batch, COMPUTE_BYTES[dtype]
    t, passes = seq_len // D, _passes(point.remat)
    exposed = overlapped = cp = 0.0
    if D > 1:
        g = model_cfg.gdn
        H, Dk, Dv = g.num_v_heads, g.head_k_dim, g.head_v_dim
        pair = B * H * Dk * (Dk + Dv) * FLOAT32_BYTES
        if point.mode == "ulysses":
            heads = UlyssesHeads(num_k_heads=g.num_k_heads, num_v_heads=H, chips=D)
            Hl, G = heads.value_heads_per_chip, heads.key_heads_per_chip
            per_pass = (D - 1) * B * t * (2 * G * Dk + 2 * Hl * Dv + 2 * Hl) * b
        else:
            per_pass = {"p2p": B * H * Dk * Dv * FLOAT32_BYTES, "all_gather": (D - 1) * pair,
                        "log_scan": math.ceil(math.log2(D)) * pair}[point.mode]
            per_pass += B * (g.conv_kernel_size - 1) * g.conv_dim * b
        exposed += gdn_layers * passes * per_pass
        if attn_layers:
            forward, backward = _attention_bytes(model_cfg, point.attn_cp, D=D, B=B, t=t, b=b)
            hidden = {"ring": forward, "all_gather_kv": 0, "ulysses": 0}[point.attn_cp]
            exposed += attn_layers * ((passes - 1) * (forward - hidden)
                                      + (backward if point.attn_cp == "ulysses" else 0))
            overlapped += attn_layers * ((passes - 1) * hidden
                                         + (0 if point.attn_cp == "ulysses" else backward))
        cp = exposed + overlapped
    N = point.chips
    sync = 0.0
    if N > 1:
        params = param_counts(model_cfg.stand_in, N, framework).total
        if point.param_sharding == "fsdp":
            sync = (N - 1) / N * params * (2 * b + FLOAT32_BYTES)
        else:
            sync = 2 * (N - 1) / N * params * FLOAT32_BYTES
    return CommBytes(exposed=exposed, overlapped=overlapped + sync, cp=cp, sync=sync)


def _attention_bytes(model_cfg: ModelConfig, attn_cp: str, *, D: int, B: int, t: int, b: int
                     ) -> tuple[float, float]:
    """(forward, backward) bytes of one attention layer per chip (torch_gdn.cp.attention's
    attention_comm_bytes, here without torch)."""
    a = model_cfg.attention
    kv_block = B * t * a.num_kv_heads * 2 * a.head_dim
    if attn_cp == "all_gather_kv":
        return (D - 1) * kv_block * b, (D - 1) * kv_block * b
    if attn_cp == "ring":
        return (D - 1) * kv_block * b, (D - 1) * kv_block * (b + FLOAT32_BYTES)
    heads = UlyssesHeads(num_k_heads=a.num_kv_heads, num_v_heads=a.num_heads, chips=D)
    each = (D - 1) * B * t * a.head_dim * b * (2 * a.num_heads // D
                                               + 2 * heads.key_heads_per_chip)
    return each, each


def _attention_rounds(model_cfg: ModelConfig, point: Point) -> int:
    """Exposed dependent rounds of the attention layers: all_gather_kv's forward gather,
    ulysses' two all-to-alls per pass (a ring's hops hide behind its blocks)."""
    attn_layers = _layers(model_cfg)[1]
    if point.cp_chips == 1 or not attn_layers:
        return 0
    per = {"all_gather_kv": _passes(point.remat) - 1, "ring": 0,
           "ulysses": 2 * _passes(point.remat)}[point.attn_cp]
    return attn_layers * per


def busiest_chip_flops(model_cfg: ModelConfig, point: Point, *, batch: int, seq_len: int,
                       kernels: str) -> float:
    """Hardware FLOPs per step of the busiest chip of a replica: the mean (hardware FLOPs ÷ cp)
    plus, for a ring over contiguous shards, the causal attention the last chip computes
    beyond the mean (D blocks of t² pairs against (D + 1)/2; zigzag balances them)."""
    D = point.cp_chips
    flops = hardware_flops(
        model_cfg, mode=point.mode, chips=D, batch=batch, seq_len=seq_len,
        framework=point.framework, remat=point.remat, attn_cp=point.attn_cp or "all_gather_kv",
        layout=point.layout, kernels=kernels) / D
    attn_layers = _layers(model_cfg)[1]
    if attn_layers and D > 1 and point.attn_cp == "ring" and point.layout == "contiguous":
        a, t = model_cfg.attention, seq_len // D
        extra_pairs = (D - (D + 1) / 2) * t * t
        flops += (FWD_BWD_MULTIPLIER * 2 * FLOPS_PER_MAC * batch * a.num_heads * a.head_dim
                  * extra_pairs * attn_layers)
    return flops


def hbm_bytes(model_cfg: ModelConfig, point: Point, *, batch: int, seq_len: int, dtype: str,
              kernels: str) -> float:
    """The bytes one chip must move through HBM per step at least (module docstring)."""
    train = TrainConfig(batch_size=batch, seq_len=seq_len, dtype=dtype,
                        param_sharding=point.param_sharding, remat=point.remat)
    memory = step_memory(
        model_cfg.stand_in, train, mode=point.mode, chips=point.cp_chips, dp=point.dp,
        framework=point.framework, attn_cp=point.attn_cp or "all_gather_kv",
        layout=point.layout, kernels=kernels)
    weights = param_counts(model_cfg.stand_in, point.chips, point.framework).total
    return (_passes(point.remat) * weights * COMPUTE_BYTES[dtype] + 2 * memory.grads
            + 2 * (memory.weights + memory.optimizer_state) + 2 * memory.activations)


@functools.lru_cache(maxsize=64)
def _chip(accelerator: str, dtype: str) -> tuple[float, float, LinkPrior]:
    """(peak FLOP/s in the dtype, HBM bytes/s, link prior) of a chip type."""
    return (datasheets.peak_flops_per_chip(accelerator, dtype),
            datasheets.hbm_bandwidth_per_chip(accelerator), link_prior(accelerator))


def roofline(request: CapacityRequest, model_cfg: ModelConfig, point: Point, *,
             peak: float | None = None) -> Roofline | None:
    """The roof of `point` on request.accelerator (None on virtual CPU chips unless `peak`,
    a calibrated FLOP/s, is given: their HBM term is then left out — no datasheet — and the
    links are the CPU prior)."""
    if request.accelerator == "cpu":
        if peak is None:
            return None
        bandwidth, link = float("inf"), link_prior("cpu")
    else:
        peak, bandwidth, link = _chip(request.accelerator, request.dtype)
    B, T = request.batch_size, request.seq_len
    comm = comm_bytes(model_cfg, point, batch=B, seq_len=T, dtype=request.dtype,
                      framework=point.framework)
    gdn_layers = _layers(model_cfg)[0]
    rounds = (dependent_rounds(point.mode, point.cp_chips, num_layers=gdn_layers,
                               remat=point.remat, dp=point.dp)
              + _attention_rounds(model_cfg, point))
    return Roofline(
        compute_s=busiest_chip_flops(model_cfg, point, batch=B, seq_len=T,
                                     kernels=request.kernels) / peak,
        hbm_s=hbm_bytes(model_cfg, point, batch=B, seq_len=T, dtype=request.dtype,
                        kernels=request.kernels) / bandwidth,
        overlapped_s=comm.overlapped / link.bytes_per_s,
        exposed_s=comm.exposed / link.bytes_per_s, latency_s=rounds * link.latency_s,
        comm=comm)


def estimate_step(request: CapacityRequest, model_cfg: ModelConfig, point: Point,
                  efficiency: Efficiency, why: str = "", *, peak: float | None = None
                  ) -> Figure | None:
    """Step seconds of `point` at `efficiency`'s MFU, no faster than its roof (basis
    "roofline"; the note gives the roof's parts, the efficiency range's step times, and
    `why` no trial answered). `peak`: a calibrated FLOP/s for virtual CPU chips."""
    roof = roofline(request, model_cfg, point, peak=peak)
    if roof is None:
        return None
    peak = peak if request.accelerator == "cpu" else _chip(request.accelerator, request.dtype)[0]
    per_chip = model_flops(model_cfg, batch=request.batch_size,
                           seq_len=request.seq_len) / point.cp_chips

    def at(mfu: float) -> float:
        return max(per_chip / (mfu * peak), roof.seconds)

    seconds = at(efficiency.mfu)
    roof_binds = roof.seconds >= per_chip / (efficiency.mfu * peak)
    return Figure(
        value=seconds, basis="roofline",
        note=f"roofline at {efficiency.label}"
             + (" — the roof binds: slower than that MFU" if roof_binds else "")
             + f"; {100 * efficiency.low:.1f}–{100 * efficiency.high:.0f}% MFU: "
               f"{at(efficiency.high):.3g}–{at(efficiency.low):.3g} s; roof {roof.seconds:.3g} s "
               f"({roof.bound}-bound: compute {roof.compute_s:.3g} s, HBM {roof.hbm_s:.3g} s, "
               f"links {roof.overlapped_s:.3g} s overlapped + {roof.exposed_s:.3g} s exposed, "
               f"latency {roof.latency_s:.2g} s)" + (f"; the fits: {why}" if why else ""))


def scaled_by_count(rows, point: Point, request: CapacityRequest, model_cfg: ModelConfig
                    ) -> tuple[int, int, tuple[int, ...]] | None:
    """(CP bytes, gradient-sync bytes, trial ids) per chip at `point` (a replica, dp = 1) from
    the recorded bytes of the nearest chip count among `rows` (same mode, attn_cp, layout),
    each part scaled by the analytic count's ratio (comm_bytes) between the two points; None
    without a record."""
    if point.chips == 1:
        return 0, 0, ()
    known = [o for o in rows if o.chips > 1 and o.dp == 1 and o.cp_comm_bytes is not None
             and o.grad_sync_bytes is not None]
    if not known:
        return None
    base = min(known, key=lambda o: (abs(math.log(o.chips / point.chips)), -o.trial_id))
    there = comm_bytes(model_cfg, dataclasses.replace(point, chips=base.chips),
                       batch=base.batch_size, seq_len=base.seq_len, dtype=request.dtype,
                       framework=point.framework)
    here = comm_bytes(model_cfg, point, batch=request.batch_size, seq_len=request.seq_len,
                      dtype=request.dtype, framework=point.framework)
    cp = base.cp_comm_bytes * (here.cp / there.cp if there.cp else 1.0)
    sync = base.grad_sync_bytes * (here.sync / there.sync if there.sync else 1.0)
    return round(cp), round(sync), (base.trial_id,)


def roofline_comm(request: CapacityRequest, model_cfg: ModelConfig, point: Point) -> Figure:
    """The analytic bytes per chip (comm_bytes), where no trial recorded any."""
    comm = comm_bytes(model_cfg, point, batch=request.batch_size, seq_len=request.seq_len,
                      dtype=request.dtype, framework=point.framework)
    return Figure(value=comm.total, basis="predicted",
                  note="analytic count (planner.roofline.comm_bytes): no trial recorded these "
                       "bytes")


__all__ = ["CommBytes", "Roofline", "busiest_chip_flops", "comm_bytes", "efficiency_for",
           "estimate_step", "hbm_bytes", "roofline", "roofline_comm", "scaled_by_count"]
