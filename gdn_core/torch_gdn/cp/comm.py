"""Counted, differentiable collectives for the CP modes (gloo and NCCL).

Every wrapper records the bytes THIS rank receives, separately for the forward and the backward
pass, into each `CommCounter` opened with `count_comm()`:
    all_gather          (D−1) remote shards
    all_to_all_single   the (D−1)/D remote part of the output
    shift / send_recv   the received tensor
    broadcast           non-source ranks: the tensor; backward (a reduce): (D−1) tensors on src
Ranks are positions in `group` (0 … D−1); peers are translated to global ranks for torch.

Backward passes of these wrappers issue collectives; autograd must reach them in the same order
on every rank (a loss that touches the same outputs on every rank does).
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Iterator

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn

_ACTIVE: list["CommCounter"] = []  # global, not thread-local: CUDA backward runs on other threads


@dataclasses.dataclass(slots=True)
class CommCounter:
    """Bytes received by this rank, split by pass, plus one (op, phase, nbytes) row per call."""

    forward_bytes: int = 0
    backward_bytes: int = 0
    calls: list[tuple[str, str, int]] = dataclasses.field(default_factory=list)

    @property
    def bytes_received(self) -> int:
        return self.forward_bytes + self.backward_bytes

    def bytes_of(self, op: str, phase: str | None = None) -> int:
        """Bytes received by calls named `op` (optionally only 'forward' or 'backward')."""
        return sum(n for o, p, n in self.calls if o == op and phase in (None, p))


@contextlib.contextmanager
def count_comm() -> Iterator[CommCounter]:
    """Count the bytes this rank receives in CP collectives inside the block (nestable)."""
    counter = CommCounter()
    _ACTIVE.append(counter)
    try:
        yield counter
    finally:
        _ACTIVE.remove(counter)


def record(op: str, nbytes: int, *, backward: bool) -> None:
    """Add `nbytes` received by `op` to every open counter."""
    phase = "backward" if backward else "forward"
    for counter in _ACTIVE:
        counter.calls.append((op, phase, int(nbytes)))
        if backward:
            counter.backward_bytes += int(nbytes)
        else:
            counter.forward_bytes += int(nbytes)


def nbytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


def rank_size(group) -> tuple[int, int]:
    """(this rank's position in `group`, D)."""
    return dist.get_rank(group), dist.get_world_size(group)


def global_rank(group, group_rank: int) -> int:
    return dist.get_global_rank(group, group_rank) if group is not None else group_rank


def send_recv(send: torch.Tensor | None, send_to: int | None, recv: torch.Tensor | None,
              recv_from: int | None, *, group, tag: int, op: str, backward: bool) -> None:
    """Send `send` to group rank `send_to` and receive into `recv` from `recv_from` (either may
    be None), as one batch; blocks until both are done. Not differentiable (a building block)."""
    ops = []
    if send is not None and send_to is not None:
        ops.append(dist.P2POp(dist.isend, send.contiguous(), global_rank(group, send_to), group, tag))
    if recv is not None and recv_from is not None:
        assert recv.is_contiguous()
        ops.append(dist.P2POp(dist.irecv, recv, global_rank(group, recv_from), group, tag))
        record(op, nbytes(recv), backward=backward)
    for work in dist.batch_isend_irecv(ops) if ops else ():
        work.wait()


def _peer(rank: int, step: int, D: int) -> int | None:
    """rank + step when it is a rank of the group (0 … D−1), else None."""
    return rank + step if 0 <= rank + step < D else None


class _Shift(torch.autograd.Function):
    """y_r = x_{r−d} (zeros where r − d is no rank); backward: dx_r = dy_{r+d} (zeros where
    r + d is none). d may be negative: d < 0 shifts down the ranks (y_r = x_{r+|d|})."""

    @staticmethod
    def forward(ctx, x, offset, group, tag, op):
        rank, D = rank_size(group)
        ctx.offset, ctx.group, ctx.tag, ctx.op = offset, group, tag, op
        y = torch.zeros_like(x, memory_format=torch.contiguous_format)
        send_recv(x, _peer(rank, offset, D), y, _peer(rank, -offset, D),
                  group=group, tag=tag, op=op, backward=False)
        return y

    @staticmethod
    def backward(ctx, dy):
        rank, D = rank_size(ctx.group)
        dx = torch.zeros_like(dy, memory_format=torch.contiguous_format)
        send_recv(dy, _peer(rank, -ctx.offset, D), dx, _peer(rank, ctx.offset, D),
                  group=ctx.group, tag=ctx.tag + 1, op=ctx.op, backward=True)
        return dx, None, None, None, None


def shift(x: torch.Tensor, offset: int, *, group, tag: int, op: str) -> torch.Tensor:
    """Differentiably receive rank (r − offset)'s `x` (zeros where there is no such rank); same
    shape as x. offset > 0: from an earlier rank (p2p's and log_scan's scans up the ranks);
    offset < 0: from a later one (log_scan's scan down zigzag's second segments).

    `tag` (forward; backward uses tag+1) keeps different exchanges between one pair apart on gloo.
    """
    return _Shift.apply(x, offset, group, tag, op)


@contextlib.contextmanager
def no_deprecation_warning():
    """torch 2.13 marks torch.distributed.nn.functional, all_gather_into_tensor and
    reduce_scatter_tensor deprecated (FutureWarning) in favour of names torch 2.9 lacks; they
    are still the paths that work on gloo and NCCL alike, in every torch from 2.9 on."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


class _BackwardTap(torch.autograd.Function):
    """Identity on the outputs of a torch collective: counts its backward, fixes grad strides."""

    @staticmethod
    def forward(ctx, op, backward_bytes, *xs):
        ctx.op, ctx.backward_bytes = op, backward_bytes
        return tuple(x.view_as(x) for x in xs)

    @staticmethod
    def backward(ctx, *grads):
        record(ctx.op, ctx.backward_bytes, backward=True)
        # gloo's collective backward allocates with empty_like(grad): strides must be contiguous.
        return (None, None) + tuple(g.contiguous() for g in grads)


class _AllGather(torch.autograd.Function):
    """x of every rank → [D, *x.shape], gathered into one buffer; backward: a reduce-scatter
    (each rank sums the D ranks' gradients of its own x). Single-buffer collectives
    (all_gather_into_tensor / reduce_scatter_tensor: in torch 2.9 … 2.13, where the newer
    *_single names are not) serve any subgroup on gloo; torch.distributed.nn's all_gather
    backward scatters from group ranks taken as global ones, which fails on a group not
    starting at global rank 0."""

    @staticmethod
    def forward(ctx, x, group, op):
        D = rank_size(group)[1]
        ctx.group, ctx.op = group, op
        gathered = x.new_empty((D * x.numel(),))
        with no_deprecation_warning():
            dist.all_gather_into_tensor(gathered, x.reshape(-1), group=group)
        record(op, (D - 1) * nbytes(x), backward=False)
        return gathered.view(D, *x.shape)

    @staticmethod
    def backward(ctx, d_gathered):
        D = rank_size(ctx.group)[1]
        dx = d_gathered.new_empty(d_gathered.shape[1:])
        with no_deprecation_warning():
            dist.reduce_scatter_tensor(dx.view(-1), d_gathered.contiguous().view(-1),
                                       group=ctx.group)
        record(ctx.op, (D - 1) * nbytes(dx), backward=True)
        return dx, None, None


def all_gather(x: torch.Tensor, *, group, op: str = "all_gather") -> list[torch.Tensor]:
    """Differentiable all-gather: [x_0, …, x_{D−1}] (x_r from rank r). Counts (D−1)·|x| each way."""
    return list(_AllGather.apply(x.contiguous(), group, op).unbind(0))


def all_to_all_single(x: torch.Tensor, *, group, op: str = "all_to_all") -> torch.Tensor:
    """Differentiable all-to-all of equal splits along dim 0 (x.shape[0] divisible by D):
    block j of x goes to rank j; block s of the result came from rank s. Counts (D−1)/D·|x|."""
    _, D = rank_size(group)
    if x.shape[0] % D:
        raise ValueError(f"all_to_all_single: leading dim {x.shape[0]} is not divisible by D={D}")
    x = x.contiguous()
    remote = nbytes(x) * (D - 1) // D
    record(op, remote, backward=False)
    with no_deprecation_warning():
        y = dist_fn.all_to_all_single(torch.empty_like(x), x, group=group)
    (y,) = _BackwardTap.apply(op, remote, y)
    return y.contiguous()


class _Broadcast(torch.autograd.Function):
    """y = x_src on every rank; backward: dx_src = Σ_r dy_r (a reduce), dx = 0 elsewhere."""

    @staticmethod
    def forward(ctx, x, src, group, op):
        rank, D = rank_size(group)
        ctx.src, ctx.group, ctx.op = src, group, op
        y = x.detach().clone(memory_format=torch.contiguous_format)
        dist.broadcast(y, global_rank(group, src), group=group)
        if rank != src:
            record(op, nbytes(y), backward=False)
        return y

    @staticmethod
    def backward(ctx, dy):
        rank, D = rank_size(ctx.group)
        dx = dy.clone(memory_format=torch.contiguous_format)
        dist.reduce(dx, global_rank(ctx.group, ctx.src), op=dist.ReduceOp.SUM, group=ctx.group)
        if rank != ctx.src:
            return torch.zeros_like(dx), None, None, None
        record(ctx.op, (D - 1) * nbytes(dx), backward=True)
        return dx, None, None, None


def broadcast(x: torch.Tensor, *, src: int, group, op: str = "broadcast") -> torch.Tensor:
    """Differentiable broadcast of group rank `src`'s x (every rank passes a tensor of x's shape;
    pass one that depends on the same inputs on every rank so backward runs everywhere)."""
    return _Broadcast.apply(x, src, group, op)


class _KeepInBackward(torch.autograd.Function):
    """Identity on x that also takes `tensors` as inputs and hands them zero gradients."""

    @staticmethod
    def forward(ctx, x, *tensors):
        ctx.like = [(t.shape, t.dtype, t.device) for t in tensors]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dx):
        return (dx,) + tuple(torch.zeros(s, dtype=d, device=dev) for s, d, dev in ctx.like)


def keep_in_backward(x: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
    """Return x, tying `tensors` (outputs of exchanges) to it for autograd.

    A collective's backward runs only where its outputs reach the loss. When a rank does not
    need what it received (rank 0 receives nothing useful; a pair only the final state uses),
    tie it to a tensor that always reaches the loss (the incoming state h_in) so that this rank
    still answers the backward exchange its peers wait for.
    """
    return _KeepInBackward.apply(x, *tensors)
