"""Context-parallel training: a per-rank runner, its verify against one chip, and the choice of
gradient sum over the step's group (cp.grad_sync).

The step's group holds dp replicas × D CP ranks (cp.mesh; dp = 1: one CP group). Replica d
trains on rows d·B … (d+1)·B − 1 of the global batch (dp·B sequences); each rank of its CP
group holds a sequence shard of those rows (cp_layout: contiguous, or the zigzag segments r
and 2D−1−r) and the model (GDN-only, or the hybrid decoder whose attention layers run under
`attn_cp`) in the layout of TrainConfig.param_sharding (cp.sharding: replicated, zero1 or fsdp
over the whole group). CP exchanges stay within the replica's CP group.
Its loss is (sum of its token losses) / (global token count dp·B·T) (train_step's
global_tokens), so the losses and parameter gradients of all dp·D ranks each sum to the
single-chip ones on the global batch: the gradients are all-reduced over the whole group (SUM;
gloo has no AVG) while backward runs and waited for before the optimizer step
(grad_sync.OverlappedGradientSum; fsdp: FSDP2's reduce-scatter, also SUM), after which the
ranks' weights are the single-chip step's. A timed step reads nothing back to the host: its loss
stays a device tensor until the steps are over.
Legend: B batch per replica, T global tokens, t = T/D tokens per rank.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from ... import device_memory
from ...config import FULL_ATTENTION, ModelConfig
from ...cp_layout import Layout, local_positions
from ...cp_modes import CPSettings
from ...data import synthetic_tokens
from ...kernels import ResolvedKernels
from ...memory.verify import verify_seq_len
from ...testing import max_verify_error
from ...train_config import CPTrainReport, TrainConfig
from ..attention_kernels import resolve_torch_attention_kernel
from ..gdn_kernels import GDNKernelName, resolve_torch_gdn_kernel
from ..init import materialise
from ..model import set_remat
from ..timed_steps import one_more_step, run_timed_steps
from ..train import language_model, packed_boundaries, train_step
from .comm import count_comm, rank_size
from .grad_sync import GRAD_SYNC_OP, OverlappedGradientSum
from .layer import context_parallel
from .mesh import dp_cp_mesh
from .sharding import (
    COMM_SOURCE,
    build_sharded_optimizer,
    check_param_sharding,
    full_tensors,
    shard_parameters,
    weight_sync_bytes,
)

def gradient_sync(param_sharding: str, *, group):
    """train_step's grad_sync: the gradient sum over `group` overlapped with backward
    (grad_sync.OverlappedGradientSum: replicated, zero1), or None under fsdp (FSDP2 sums,
    overlapping its reduce-scatters with backward itself)."""
    check_param_sharding(param_sharding)
    return None if param_sharding == "fsdp" else OverlappedGradientSum(group=group)


def build_cp_training(model_cfg: ModelConfig, train_cfg: TrainConfig, *, group, cp: CPSettings,
                      device: str | torch.device = "cpu",
                      gdn_kernel: GDNKernelName | None = None):
    """Return (model, optimizer) of this rank: the seeded model (checked equal on every rank),
    made context-parallel under `cp` (GDN layers cp.mode with the rule kernel of cp.kernels /
    `gdn_kernel`, attention layers cp.attn_cp with the attention kernel of cp.kernels, shards
    in cp.layout: layer.context_parallel), train_cfg.remat set, laid out per
    train_cfg.param_sharding. `group` holds all cp.chips ranks; with cp.dp > 1 replicas the CP
    layers run on this rank's replica's CP group (mesh.dp_cp_mesh), the weight layout stays
    over the whole group.

    Initialised sharded (init.py): built on the meta device, made context-parallel and laid
    out there, then only this rank's part of the seeded weights is materialised on `device`
    (fsdp: its FSDP2 shards; replicated and zero1 hold the weights whole by definition, and
    zero1's AdamW state is created, for this rank's parameters only, at the first step). No
    rank's device ever holds more weights than its layout keeps; the values are the one-chip
    build_model's bit for bit.
    """
    with torch.device("meta"):  # shapes only: the seeded draws of reset_parameters are no-ops
        model = set_remat(language_model(model_cfg, seed=train_cfg.seed), train_cfg.remat)
    cp_group = dp_cp_mesh(group, dp=cp.dp, device_type=torch.device(device).type).cp_group
    # In place, before FSDP2 wraps the blocks.
    context_parallel(model, group=cp_group, cp=cp, gdn_kernel=gdn_kernel)
    shard_parameters(model, train_cfg, group=group, device=device)
    checksum = materialise(model, seed=train_cfg.seed, device=device)
    check_same_checksum(checksum, group=group, device=torch.device(device))
    return model, build_sharded_optimizer(model, train_cfg, group=group)


def check_same_checksum(checksum: float, *, group, device: torch.device) -> None:
    """Raise RuntimeError (on every rank) unless every rank's weight checksum is the same."""
    max_and_neg_min = torch.tensor([checksum, -checksum], dtype=torch.float64, device=device)
    dist.all_reduce(max_and_neg_min, op=dist.ReduceOp.MAX, group=group)
    high, low = max_and_neg_min[0].item(), -max_and_neg_min[1].item()
    if high != low:  # the same on every rank, so every rank raises
        raise RuntimeError(f"weights differ across the CP group: checksums range from {low!r} "
                           f"to {high!r}; build the model with the same seed on every rank")


def shard_batch(tokens_BT1: torch.Tensor, *, rank: int, chips: int,
                layout: Layout = "contiguous", dp: int = 1):
    """This rank's (inputs, targets) [B, t] of the global batch tokens [dp·B, T+1]: rank (of
    chips = dp × D) is replica rank // D at CP position r = rank % D (cp.mesh); it takes its
    replica's rows d·B … (d+1)·B − 1 at the positions cp_layout.local_positions gives r
    (contiguous: r·t … (r+1)·t−1), in local order."""
    if tokens_BT1.shape[0] % dp:
        raise ValueError(f"a global batch of {tokens_BT1.shape[0]} sequences does not split "
                         f"over dp={dp} replicas")
    B, D = tokens_BT1.shape[0] // dp, chips // dp
    replica, cp_rank = divmod(rank, D)
    rows_BT1 = tokens_BT1[replica * B:(replica + 1) * B]  # dp == 1: all of them, no copy
    T = rows_BT1.shape[1] - 1
    if layout == "contiguous":
        t = T // D
        seq = slice(cp_rank * t, (cp_rank + 1) * t)
        return rows_BT1[:, :-1][:, seq], rows_BT1[:, 1:][:, seq]
    positions = torch.from_numpy(local_positions(chip=cp_rank, chips=D, seq_len=T,
                                                 layout=layout)).to(rows_BT1.device)
    return rows_BT1[:, :-1][:, positions], rows_BT1[:, 1:][:, positions]


class _GradientsOnly(torch.optim.Optimizer):
    """An optimizer whose step does nothing: train_step's forward, backward and grad_sync
    without an update (for comparing gradients at fixed weights)."""

    def __init__(self, params) -> None:
        super().__init__(params, defaults={})

    def step(self, closure=None):
        return None


def _global_sum(values: list[torch.Tensor], *, group) -> list[float]:
    """Sum each scalar tensor over the group in one all-reduce (float64), then read the sums
    back to the host; the same result on every rank."""
    total = torch.stack([v.reshape(()) for v in values]).double()
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    return total.tolist()


def verify_against_single_chip(model: nn.Module, inputs_Bt: torch.Tensor,
                               targets_Bt: torch.Tensor, tokens_BT1: torch.Tensor, *,
                               model_cfg: ModelConfig, train_cfg: TrainConfig, group) -> float:
    """Max relative error of the CP global loss and summed gradients against one chip.

    Each gradient's error is relative to max(its norm, testing.VERIFY_GRAD_FLOOR × the norm of the
    whole reference gradient), so round-off on near-zero gradients does not dominate.

    `model` is the context-parallel model at its current weights, in train_cfg's
    param_sharding and remat; rank 0 also builds the plain single-chip model (replicated, no
    remat) with those same weights (fsdp shards gathered) and runs it on the whole of
    tokens_BT1 [dp·B, T+1], the global batch of all replicas (a prefix of the run's sequence
    verifies that prefix: pass its tokens, this rank's shard of it and its seq_len: its
    packed documents are the sequence's first ones, packed_boundaries); `group` holds every
    rank of every replica. Every rank returns the same value. Leaves no gradients behind.
    """
    rank, _ = rank_size(group)
    device = inputs_Bt.device
    global_tokens = tokens_BT1.shape[0] * (tokens_BT1.shape[1] - 1)
    cu_seqlens = packed_boundaries(train_cfg)
    share = train_step(model, _GradientsOnly(model.parameters()), inputs_Bt, targets_Bt,
                       global_tokens=global_tokens, dtype=train_cfg.dtype,
                       grad_sync=gradient_sync(train_cfg.param_sharding, group=group),
                       cu_seqlens=cu_seqlens)
    (cp_loss,) = _global_sum([share], group=group)
    # Same parameter names: the CP layers (and FSDP2) keep the plain layers' names.
    names, params = zip(*model.named_parameters())
    cp_grads = dict(zip(names, full_tensors([p.grad for p in params])))  # collectives: all ranks
    weights = {name: p.detach() for name, p in zip(names, full_tensors(list(params)))}
    err = torch.zeros(1, dtype=torch.float64, device=device)
    if rank == 0:
        ref = language_model(model_cfg).to(device)
        ref.load_state_dict(weights)
        ref_loss = train_step(ref, _GradientsOnly(ref.parameters()), tokens_BT1[:, :-1],
                              tokens_BT1[:, 1:], global_tokens=global_tokens,
                              dtype=train_cfg.dtype, cu_seqlens=cu_seqlens)
        err.fill_(max_verify_error(ref_loss.item(), cp_loss, [p.grad for p in ref.parameters()],
                                   [cp_grads[name] for name, _ in ref.named_parameters()]))
    dist.broadcast(err, group_src=0, group=group)
    model.zero_grad(set_to_none=True)
    return err.item()


def verified_length(model_cfg: ModelConfig, train_cfg: TrainConfig, *, group, cp: CPSettings,
                    device: torch.device, budget_bytes: int | None) -> int | None:
    """Tokens per sequence the verify compares (memory.verify.verify_seq_len), decided by rank
    0, whose chip runs the reference, within budget_bytes (default: that chip's capacity,
    device_memory.torch_chip_capacity, on CPU shared over the group's ranks as an upper bound
    on those of its host), and broadcast so every rank runs the same CP verify step.

    With cp.dp replicas the reference runs the global batch (dp × train_cfg.batch_size
    sequences) and the prefix must split over one replica's D = cp.cp_chips CP chips (GDN
    mode cp.mode); rank 0's resident state is laid out over all dp·D chips."""
    rank, chips = rank_size(group)
    global_cfg = dataclasses.replace(train_cfg, batch_size=cp.dp * train_cfg.batch_size)
    length = torch.zeros(1, dtype=torch.int64, device=device)
    if rank == 0:
        if budget_bytes is None:
            budget_bytes, _ = device_memory.torch_chip_capacity(device, chips_on_host=chips)
        verified = train_cfg.seq_len if budget_bytes is None else verify_seq_len(
            model_cfg, global_cfg, mode=cp.mode, chips=cp.cp_chips, framework="torch",
            attn_cp=cp.attn_cp, layout=cp.layout, budget_bytes=budget_bytes, dp=cp.dp)
        length.fill_(0 if verified is None else verified)
    dist.broadcast(length, group_src=0, group=group)
    return int(length.item()) or None


def resolve_step_kernels(model_cfg: ModelConfig, train_cfg: TrainConfig, cp: CPSettings, *,
                         device: torch.device,
                         gdn_kernel: GDNKernelName | None = None) -> ResolvedKernels:
    """What this rank's step runs for cp.kernels, named with versions (the answer its report
    carries to the trial's result): the GDN rule (resolve_torch_gdn_kernel; a caller-chosen
    gdn_kernel under "fused" is named as such) and, in a decoder with attention layers, the
    attention kernel (resolve_torch_attention_kernel). Raises kernels.KernelUnavailable with
    the reason where a fused kernel cannot serve the point — on every rank alike, before any
    collective."""
    if cp.kernels == "fused" and gdn_kernel is not None:
        gdn = f"gdn_kernel={gdn_kernel!r} under kernels='fused' (chosen by the caller)"
    else:
        gdn, _ = resolve_torch_gdn_kernel(cp.kernels, device=device, dtype=train_cfg.dtype,
                                          chunk_size=model_cfg.gdn.chunk_size,
                                          head_k_dim=model_cfg.gdn.head_k_dim)
    attention = None
    if FULL_ATTENTION in model_cfg.layer_pattern:
        attention = resolve_torch_attention_kernel(cp.kernels, device=device,
                                                   dtype=train_cfg.dtype,
                                                   head_dim=model_cfg.attention.head_dim)
    return ResolvedKernels(gdn=gdn, attention=attention)


def run_cp_training(model_cfg: ModelConfig, train_cfg: TrainConfig, *, group, cp: CPSettings,
                    steps: int, warmup_steps: int = 1, device: str | torch.device = "cpu",
                    verify: bool = False,
                    verify_memory_budget_bytes: int | None = None,
                    gdn_kernel: GDNKernelName | None = None,
                    after_timed_steps: Callable[[Callable[[], None]], None] | None = None
                    ) -> CPTrainReport:
    """Train under CP on one fixed synthetic batch; call on every rank of `group` (cp.chips
    ranks: cp.dp replicas × cp.cp_chips, group rank r in replica r // cp_chips, cp.mesh).

    Every rank builds the same model and optimizer (build_cp_training: seed train_cfg.seed,
    checked by a checksum; context-parallel over its replica's CP group with GDN cp.mode and,
    in a hybrid decoder (model_cfg.layers 'hybrid'), attention cp.attn_cp with the attention
    kernel of cp.kernels; train_cfg.remat and param_sharding (over all cp.chips) applied),
    takes its shard of its replica's train_cfg.batch_size sequences of the global batch
    (cp.dp × batch_size sequences of train_cfg.seq_len tokens) in cp.layout (shard_batch), and
    packed as train_cfg.documents says (the same global boundaries on every rank), and runs
    warmup_steps untimed then `steps` timed steps
    of train_step (grad_sync: gradient_sync) through timed_steps.run_timed_steps: a step's
    time starts after a barrier (ranks start together) and ends with the device
    synchronised. CP bytes are
    counted over the first timed step (under remat they include the exchanges its backward
    re-issues); grad_sync_bytes_per_step adds to the counted gradient all-reduce the weight
    collectives of zero1 / fsdp (sharding.weight_sync_bytes, comm_source says so). verify=True
    first compares loss and gradients at the initial weights against one chip on the global
    batch (max_rel_err) on as much of the sequence as that chip holds beside the step's state
    (verified_length within verify_memory_budget_bytes; verified_seq_len).
    Returns this rank's report (chips: all cp.chips; grad-sync bytes over all of them, CP
    bytes within the replica); losses (every step, global mean) are equal on every rank.
    Peak memory is measured over the whole run, verify included (device_memory: CUDA's
    allocator peak, on CPU the process's RSS high-water mark); torch has no compile-time
    estimate (estimated_memory_bytes None) and no compile (compile_time_s 0).
    Raises ValueError naming the numbers when the group is not cp.chips ranks, or when cp's
    modes or layout cannot split the shape over cp.cp_chips (CPSettings.check_shape); raises
    kernels.KernelUnavailable (every rank alike, before any collective) when cp.kernels is
    'fused' and a fused kernel cannot serve the point here (resolve_step_kernels: on CPU
    "fla-core's chunk_gated_delta_rule needs a CUDA device"), or when a kernel refuses it
    from inside a step (timed_steps.run_step). The report names what ran (gdn_kernel,
    attention_kernel: resolve_step_kernels' answer).
    gdn_kernel="reference" (tests) runs the reference rule kernel as fla's CPU stand-in through
    the same composition instead of resolving fla; only with cp.kernels 'fused'.
    after_timed_steps: called once after everything is measured with a callable that runs one
    more step (device synchronised; in no figure of the report), e.g. to wrap it in a
    profiler. Every rank must call that callable: the step's collectives span the group.
    """
    if steps < 1 or warmup_steps < 0:
        raise ValueError(f"steps={steps} must be >= 1 and warmup_steps={warmup_steps} >= 0")
    rank, chips = rank_size(group)
    replicas = f" (dp={cp.dp} × cp_chips={cp.cp_chips})" if cp.dp > 1 else ""
    if chips != cp.chips:
        raise ValueError(f"cp.chips={cp.chips} but the process group has {chips} ranks"
                         + replicas)
    cp.check_shape(model_cfg, train_cfg.seq_len)  # the trial's one shape check
    device = torch.device(device)
    resolved = resolve_step_kernels(model_cfg, train_cfg, cp, device=device,
                                    gdn_kernel=gdn_kernel)
    device_memory.torch_reset_peak(device)
    model, optimizer = build_cp_training(model_cfg, train_cfg, group=group, cp=cp,
                                         device=device, gdn_kernel=gdn_kernel)
    # The global batch [dp·B, T+1]: every rank draws all of it and keeps its replica's rows.
    tokens_BT1 = torch.from_numpy(synthetic_tokens(
        batch_size=cp.dp * train_cfg.batch_size, seq_len=train_cfg.seq_len,
        vocab_size=model_cfg.vocab_size, seed=train_cfg.seed)).long().to(device)
    shard = functools.partial(shard_batch, rank=rank, chips=chips, layout=cp.layout, dp=cp.dp)
    inputs_Bt, targets_Bt = shard(tokens_BT1)
    cu_seqlens = packed_boundaries(train_cfg)  # on the host, the same on every rank
    max_rel_err = verified_seq_len = None
    if verify:
        verified_seq_len = verified_length(model_cfg, train_cfg, group=group, cp=cp,
                                           device=device,
                                           budget_bytes=verify_memory_budget_bytes)
        if verified_seq_len is not None:
            prefix_BT1 = tokens_BT1[:, :verified_seq_len + 1]
            max_rel_err = verify_against_single_chip(
                model, *shard(prefix_BT1), prefix_BT1,
                model_cfg=model_cfg, train_cfg=dataclasses.replace(
                    train_cfg, seq_len=verified_seq_len), group=group)
    grad_sync = gradient_sync(train_cfg.param_sharding, group=group)
    # One step, as timed and as profiled after (packed documents included).
    one_step = functools.partial(train_step, model, optimizer, inputs_Bt, targets_Bt,
                                 global_tokens=tokens_BT1.shape[0] * train_cfg.seq_len,
                                 dtype=train_cfg.dtype, grad_sync=grad_sync,
                                 cu_seqlens=cu_seqlens)
    barrier = functools.partial(dist.barrier, group=group)  # ranks start each step together
    timed = run_timed_steps(one_step, steps=steps, warmup_steps=warmup_steps, device=device,
                            before_each=barrier, measure_first=count_comm)
    comm = timed.first_timed
    peak_bytes, source = device_memory.torch_peak_memory(device)
    # One all-reduce after the loop (outside the timed steps) turns the shares (device tensors)
    # into global losses, read back to the host only then.
    losses = _global_sum(timed.results, group=group)
    counted_grad_bytes = comm.bytes_of(GRAD_SYNC_OP)
    weight_bytes = weight_sync_bytes(model, optimizer, train_cfg, group=group)
    if after_timed_steps is not None:  # after every figure is read: the extra step is in none
        after_timed_steps(one_more_step(one_step, device=device, before_each=barrier))
    return CPTrainReport(
        losses=losses, step_times_s=timed.step_times_s, peak_memory_bytes=peak_bytes,
        memory_source=source, mode=cp.mode, chips=chips, dp=cp.dp,
        cp_comm_bytes_per_step=comm.bytes_received - counted_grad_bytes,
        grad_sync_bytes_per_step=counted_grad_bytes + weight_bytes,
        comm_source=COMM_SOURCE[train_cfg.param_sharding], max_rel_err=max_rel_err,
        verified_seq_len=verified_seq_len,
        attn_cp=cp.attn_cp if FULL_ATTENTION in model_cfg.layer_pattern else None,
        layout=cp.layout, gdn_kernel=resolved.gdn, attention_kernel=resolved.attention)
