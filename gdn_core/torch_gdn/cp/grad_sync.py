"""Summing the gradients over the step's group (every CP rank of every data-parallel replica):
after backward (sum_gradients), or while backward
still runs (OverlappedGradientSum, what a CP step uses for replicated and zero1 weights; FSDP2
overlaps its own reduce-scatter).

Every rank's loss is its share of the global mean (cp.train), so the group's gradients sum to
the single-chip ones on the global batch: an all-reduce with SUM (gloo has no AVG). Bytes
follow the ring convention, 2·(D−1)/D × the gradient bytes of each dtype (D: all the group's
ranks), recorded in open count_comm() counters as op GRAD_SYNC_OP (backward phase).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn

from .comm import nbytes, rank_size, record

GRAD_SYNC_OP = "grad_sync"  # the op name the gradient sum records its bytes under (comm.py)
GRAD_BUCKET_BYTES = 25 * 2**20
"""Gradient bytes per all-reduce of OverlappedGradientSum (DDP's default bucket size)."""


def _trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _record_ring_bytes(params: list[nn.Parameter], D: int) -> int:
    """Record (and return) the ring bytes of all-reducing these parameters' gradients, one
    figure per dtype as one flat buffer of that dtype would receive."""
    by_dtype: dict[torch.dtype, int] = {}
    for p in params:
        by_dtype[p.dtype] = by_dtype.get(p.dtype, 0) + nbytes(p)
    received = 0
    for total in by_dtype.values():
        ring_bytes = 2 * (D - 1) * total // D
        record(GRAD_SYNC_OP, ring_bytes, backward=True)
        received += ring_bytes
    return received


@torch.no_grad()
def sum_gradients(model: nn.Module, group) -> int:
    """All-reduce-sum every parameter gradient over `group`, in place; return bytes received.

    Gradients travel as one flat buffer per dtype (one collective each, not one per tensor);
    a parameter without a gradient contributes zeros, so every rank sends the same layout.
    """
    _, D = rank_size(group)
    grads_by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    params = _trainable(model)
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        grads_by_dtype.setdefault(param.grad.dtype, []).append(param.grad)
    for grads in grads_by_dtype.values():
        flat = torch.cat([grad.reshape(-1) for grad in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        for grad, piece in zip(grads, flat.split([grad.numel() for grad in grads])):
            grad.copy_(piece.view_as(grad))
    return _record_ring_bytes(params, D)


@dataclasses.dataclass(slots=True)
class _Bucket:
    params: list[nn.Parameter]
    waiting: int
    """Parameters whose gradient backward has not yet produced."""
    flat: torch.Tensor | None = None
    work: object | None = None


def _buckets(params: list[nn.Parameter], bucket_bytes: int) -> list[_Bucket]:
    """Consecutive parameters of one dtype, up to bucket_bytes each (at least one)."""
    buckets: list[_Bucket] = []
    size = 0
    for p in params:
        last = buckets[-1].params if buckets else None
        if last is None or last[-1].dtype != p.dtype or size + nbytes(p) > bucket_bytes:
            buckets.append(_Bucket(params=[], waiting=0))
            size = 0
        buckets[-1].params.append(p)
        buckets[-1].waiting += 1
        size += nbytes(p)
    return buckets


class OverlappedGradientSum:
    """A train_step grad_sync that all-reduces gradients while backward still runs.

    prepare(model), called by train_step before backward, buckets the trainable parameters in
    reverse registration order (about the order backward produces their gradients) and hooks
    each one (register_post_accumulate_grad_hook): when every gradient of a bucket is there,
    the bucket is flattened and all-reduced asynchronously, buckets strictly in order, so
    every rank issues the same collectives in the same order (the same graph runs on every
    rank: CP's exchanges in backward interleave identically). Calling it after backward
    launches what backward left (zeros for a parameter without a gradient, as sum_gradients),
    waits for every bucket (on a GPU, the stream waits, not the host), copies the sums back
    into the gradients, removes the hooks and records the bytes. The sums are sum_gradients'.
    """

    def __init__(self, *, group, bucket_bytes: int = GRAD_BUCKET_BYTES) -> None:
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes={bucket_bytes} must be a positive integer")
        self.group, self.bucket_bytes = group, bucket_bytes
        self._params: list[nn.Parameter] = []
        self._buckets: list[_Bucket] = []
        self._bucket_of: dict[nn.Parameter, int] = {}
        self._ready: set[nn.Parameter] = set()
        self._launched = 0
        self._handles: list = []

    def prepare(self, model: nn.Module) -> None:
        """Hook every trainable parameter of `model` for the coming backward."""
        self._remove_hooks()
        self._params = _trainable(model)
        self._buckets = _buckets(list(reversed(self._params)), self.bucket_bytes)
        self._bucket_of = {p: i for i, b in enumerate(self._buckets) for p in b.params}
        self._ready, self._launched = set(), 0
        self._handles = [p.register_post_accumulate_grad_hook(self._on_gradient)
                         for p in self._params]

    def _on_gradient(self, param: nn.Parameter) -> None:
        if param in self._ready:
            raise RuntimeError("a parameter's gradient was accumulated twice in one backward "
                               "after its bucket was all-reduced; use sum_gradients instead")
        self._ready.add(param)
        self._buckets[self._bucket_of[param]].waiting -= 1
        self._launch_ready()

    @torch.no_grad()
    def _launch(self, bucket: _Bucket) -> None:
        for p in bucket.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        bucket.flat = torch.cat([p.grad.reshape(-1) for p in bucket.params])
        bucket.work = dist.all_reduce(bucket.flat, op=dist.ReduceOp.SUM, group=self.group,
                                      async_op=True)

    def _launch_ready(self) -> None:
        while (self._launched < len(self._buckets)
               and self._buckets[self._launched].waiting == 0):
            self._launch(self._buckets[self._launched])
            self._launched += 1

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @torch.no_grad()
    def __call__(self, model: nn.Module) -> int:
        """Finish the sum after backward; return the bytes received (ring convention)."""
        if not self._handles:
            raise RuntimeError("OverlappedGradientSum: call prepare(model) before backward")
        self._remove_hooks()
        for bucket in self._buckets[self._launched:]:
            self._launch(bucket)
        self._launched = len(self._buckets)
        for bucket in self._buckets:
            bucket.work.wait()
            for p, piece in zip(bucket.params,
                                bucket.flat.split([p.numel() for p in bucket.params])):
                p.grad.copy_(piece.view_as(p))
            bucket.flat = bucket.work = None
        return _record_ring_bytes(self._params, rank_size(self.group)[1])


__all__ = ["GRAD_BUCKET_BYTES", "GRAD_SYNC_OP", "OverlappedGradientSum", "sum_gradients"]
