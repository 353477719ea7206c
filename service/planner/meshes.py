"""dp × cp candidates of the capacity planner: a mesh of dp data-parallel replicas, each a CP
group of cp = chips / dp chips, predicted from its replica's figures.

A replica of a dp × cp mesh runs the cp-chip step on its own batch_size sequences: the same
per-chip compute, activations and CP exchanges as a dp = 1 trial on cp chips. What dp changes
is the weights: laid out (param_sharding) over all dp × cp chips and their gradients reduced
over all of them. So a mesh's figure is its replica's plus that change, computed, not fitted:

    memory  the replica's figure − predict_step_memory(cp) + predict_step_memory(cp, dp)
    comm    the replica's CP bytes + the weight bytes recorded at other chip counts, grown
            to dp × cp chips as (N − 1)/N (fits.scaled_comm_bytes)
    step    the replica's step + the extra weight bytes at the mode's fitted link bandwidth

A measured trial of exactly the mesh replaces all three; a plan trial of it (compiled, not
run) replaces the memory (its XLA estimate, `estimated`) and the bytes (its HLO's), and its
weight bytes set the step's extra sync. The link fit reads measured trials of every mesh
(fits.link_rows), but a figure grown from the replica is at best `extrapolated`, and its
note says from what.
"""

from __future__ import annotations

from collections.abc import Sequence

from gdn_core.train_config import TrainConfig
from service.planner.cached import step_memory
from service.planner.evidence import Observation
from service.planner.fits import LinkFit, scaled_comm_bytes
from service.schemas.planner import CapacityRequest, Figure

BEYOND_THE_REPLICA = {"measured": "extrapolated", "estimated": "extrapolated",
                      "interpolated": "extrapolated"}
"""The basis of a mesh figure derived from its replica's: evidence of one replica says
nothing measured about dp > 1 (extrapolated, predicted and refused stay as they are)."""


def mesh_dps(chips: int, requested: Sequence[int] | None) -> list[int]:
    """The data-parallel degrees of a chip count: the requested ones dividing it, or by
    default every power of two dividing it (dp = chips: pure data parallel)."""
    if requested:
        return sorted(d for d in set(requested) if chips % d == 0)
    return [d for d in (2 ** i for i in range(chips.bit_length())) if chips % d == 0]


def exact_mesh_trials(observations: Sequence[Observation], *, settings: tuple, mode: str,
                      chips: int, dp: int, seq_len: int) -> list[Observation]:
    """Trials of exactly this mesh point (settings as Observation.settings() with dp)."""
    return [o for o in observations if o.settings() == settings and o.chips == chips
            and o.dp == dp and o.seq_len == seq_len and o.cp_mode == mode]


def _derived(figure: Figure, value: float | None, what: str) -> Figure:
    basis = BEYOND_THE_REPLICA.get(figure.basis, figure.basis)
    return Figure(value=value if figure.value is not None else None, basis=basis,
                  trial_ids=figure.trial_ids,
                  note=f"{what}; the replica's: {figure.basis}"
                       + (f" ({figure.note})" if figure.note else ""))


def mesh_memory(request: CapacityRequest, model_cfg, *, framework: str, mode: str, cp: int,
                dp: int, param_sharding: str, remat: str, replica: Figure) -> Figure:
    """The mesh's memory per chip: the replica's figure moved by the analytic difference of
    laying the weights, gradients and AdamW state over dp × cp chips instead of cp."""
    train_cfg = TrainConfig(batch_size=request.batch_size, seq_len=request.seq_len,
                            dtype=request.dtype, param_sharding=param_sharding, remat=remat)

    def predicted(replicas: int) -> int:
        return step_memory(model_cfg, train_cfg, mode=mode, chips=cp, dp=replicas,
                           framework=framework).total

    change = predicted(dp) - predicted(1)
    value = None if replica.value is None else replica.value + change
    return _derived(replica, value, f"dp={dp} × cp={cp}: the cp={cp} replica's figure "
                                    f"{change / 2**20:+,.1f} MiB for weights, gradients and "
                                    f"AdamW state over {dp * cp} chips (predict_step_memory)")


def weight_bytes(group: Sequence[Observation], *, modes: Sequence[str], chips: int,
                 local_tokens: int) -> tuple[int, tuple[int, ...]] | None:
    """Weight-sync bytes per chip at `chips` chips, scaled from the recorded trials of the
    first of `modes` that has any (a mode's exchanges differ, its weight traffic does not)."""
    if chips == 1:
        return 0, ()
    for mode in modes:
        scaled = scaled_comm_bytes([o for o in group if o.cp_mode == mode], mode=mode,
                                   chips=chips, local_tokens=local_tokens)
        if scaled is not None:
            return scaled[1], scaled[2]
    return None


def mesh_comm_and_step(*, group: Sequence[Observation], mode: str, modes: Sequence[str],
                       cp: int, dp: int, local_tokens: int, replica_comm: Figure,
                       replica_step: Figure, links: LinkFit,
                       recorded: Sequence[Observation] = (), extra_rounds: int = 0
                       ) -> tuple[Figure, Figure]:
    """The mesh's (bytes per chip, step time): the replica's CP bytes and step, plus the
    weight traffic grown from cp chips to dp × cp chips and its time at the link fit.
    `recorded`: trials of exactly the mesh (a plan's compiled HLO, a measured trial's count):
    their bytes replace the derived ones, and their weight bytes the grown ones.
    `extra_rounds`: dependent rounds the mesh has beyond its replica's (the gradient
    reduction a one-chip replica does not make)."""
    at_replica = weight_bytes(group, modes=[mode, *modes], chips=cp,
                              local_tokens=local_tokens)
    known = [o for o in recorded if o.cp_comm_bytes is not None
             and o.grad_sync_bytes is not None]
    at_mesh = ((known[0].grad_sync_bytes, (known[0].trial_id,)) if known else
               weight_bytes(group, modes=[mode, *modes], chips=dp * cp,
                            local_tokens=local_tokens))
    if at_mesh is None or at_replica is None:
        why = (f"no trial of these settings recorded weight-sync bytes to grow to {dp * cp} "
               "chips: run or plan a multi-chip trial")
        return (Figure(value=None, basis="refused", note=why),
                Figure(value=None, basis="refused", note=why))
    extra = at_mesh[0] - at_replica[0]
    if known:
        comm = Figure(value=known[0].cp_comm_bytes + known[0].grad_sync_bytes,
                      basis="measured", trial_ids=[known[0].trial_id],
                      note=f"recorded bytes of this dp={dp} × cp={cp} mesh ({known[0].kind} "
                           "trial: HLO of the compiled step)")
    else:
        ids = sorted({*replica_comm.trial_ids, *at_mesh[1]})
        comm = _derived(replica_comm.model_copy(update={"trial_ids": ids}),
                        None if replica_comm.value is None else replica_comm.value + extra,
                        f"dp={dp}: + {extra / 2**20:,.1f} MiB of weight sync over {dp * cp} "
                        "chips")
    seconds = links.seconds(extra, rounds=extra_rounds)
    step = _derived(replica_step, None if replica_step.value is None
                    else replica_step.value + seconds,
                    f"dp={dp}: the cp={cp} replica's step + {seconds * 1e3:,.2f} ms for "
                    f"{extra / 2**20:,.1f} MiB more weight sync"
                    + (f" and {extra_rounds} more round(s)" if extra_rounds else "")
                    + f" at {links.source}")
    if known:
        step = step.model_copy(update={"trial_ids": sorted({*step.trial_ids,
                                                            known[0].trial_id})})
    return comm, step


__all__ = ["BEYOND_THE_REPLICA", "exact_mesh_trials", "mesh_comm_and_step", "mesh_dps",
           "mesh_memory", "weight_bytes"]
