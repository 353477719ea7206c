"""Data parallel × context parallel (CPSettings.dp) in torch's run_cp_training, on real gloo
process groups of 4 ranks: dp2×cp2 (two replicas, each its own CP group of 2) and dp1×cp4.

The oracle is one chip on the same global batch (dp·B sequences of T tokens, 4 × 32 for both
meshes): run_training's losses and one train_step's gradients at the seeded weights. One
spawned job per tier runs every case on every rank and returns numpy arrays and reports; the
tests only compare. Legend: dp replicas, D CP chips per replica, B sequences per replica,
T global tokens, N parameters.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pytest
import torch
import torch.distributed as dist

from gdn_core.cp_modes import CP_MODES, CPSettings
from gdn_core.data import synthetic_tokens
from gdn_core.memory.step import predict_step_memory
from gdn_core.memory.verify import verify_reference_memory
from gdn_core.presets import get_preset
from gdn_core.testing import VERIFY_GRAD_FLOOR, assert_close
from gdn_core.torch_gdn import build_model, run_cp_training, run_training, train_step
from gdn_core.torch_gdn.cp.mesh import dp_cp_mesh
from gdn_core.torch_gdn.model import DecoderBlock
from gdn_core.torch_gdn.cp.sharding import full_tensors
from gdn_core.torch_gdn.cp.train import (
    _GradientsOnly,
    build_cp_training,
    gradient_sync,
    shard_batch,
    verified_length,
)
from gdn_core.train_config import TrainConfig

from .torch_dist import run_in_process_group

CHIPS, GLOBAL_B, T = 4, 4, 32  # dp2×cp2: B = 2, t = 16; dp1×cp4: B = 4, t = 8
TOL = 1e-4  # fp32, as test_torch_cp_hybrid
STEPS = 2
MODEL = get_preset("tiny", layers="hybrid", num_layers=3)  # GDN, attention, GDN


@dataclasses.dataclass(frozen=True)
class Run:
    """One trial of the 4-rank world."""

    dp: int
    mode: str
    attn_cp: str
    layout: str
    param_sharding: str

    @property
    def name(self) -> str:
        return (f"dp{self.dp}xcp{CHIPS // self.dp}-{self.mode}-{self.attn_cp}-{self.layout}-"
                f"{self.param_sharding}")

    def train_cfg(self) -> TrainConfig:
        return TrainConfig(batch_size=GLOBAL_B // self.dp, seq_len=T, learning_rate=3e-3,
                           weight_decay=0.1, param_sharding=self.param_sharding)

    def cp(self, chips: int = CHIPS, dp: int | None = None) -> CPSettings:
        return CPSettings(mode=self.mode, chips=chips, dp=self.dp if dp is None else dp,
                          attn_cp=self.attn_cp, layout=self.layout)


# dp2×cp2 under the two layouts that shard over all 4 chips; the default tier (a 4-rank spawn
# costs most of its 20 s).
DP2_RUNS = (Run(2, "ulysses", "ulysses", "contiguous", "zero1"),
            Run(2, "log_scan", "ring", "zigzag", "fsdp"))
# dp1×cp4 (every GDN mode) and the rest of the dp2×cp2 mode × param_sharding matrix, with the
# summed gradients compared one by one; the slow tier.
SLOW_RUNS = (tuple(Run(1, m, "all_gather_kv", "contiguous", "replicated") for m in CP_MODES)
             + tuple(Run(2, m, "all_gather_kv", "contiguous", s) for m in CP_MODES
                     for s in ("replicated", "zero1", "fsdp")
                     if (m, s) not in {(r.mode, r.param_sharding) for r in DP2_RUNS}))


def global_tokens_BT1() -> torch.Tensor:
    """The global batch run_cp_training draws (seed 0): [dp·B, T+1]."""
    return torch.from_numpy(synthetic_tokens(batch_size=GLOBAL_B, seq_len=T,
                                             vocab_size=MODEL.vocab_size)).long()


def summed_gradients(rank: int, run: Run) -> dict[str, np.ndarray] | None:
    """One gradient-only step of build_cp_training's model on this rank's shard, summed over
    all 4 ranks (fsdp shards gathered); rank 0 returns them."""
    cfg = run.train_cfg()
    model, _ = build_cp_training(MODEL, cfg, group=None,
                                 cp=CPSettings(mode=run.mode, chips=CHIPS, attn_cp=run.attn_cp,
                                               layout=run.layout, dp=run.dp))
    inputs, targets = shard_batch(global_tokens_BT1(), rank=rank, chips=CHIPS,
                                  layout=run.layout, dp=run.dp)
    train_step(model, _GradientsOnly(model.parameters()), inputs, targets,
               global_tokens=GLOBAL_B * T, dtype=cfg.dtype,
               grad_sync=gradient_sync(cfg.param_sharding, group=None))
    names = [n for n, _ in model.named_parameters()]
    grads = full_tensors([p.grad for p in model.parameters()])  # collectives: every rank
    return {n: g.numpy().copy() for n, g in zip(names, grads)} if rank == 0 else None


def run_case(rank: int, run: Run, gradients: bool) -> dict:
    report = run_cp_training(MODEL, run.train_cfg(), group=None, cp=run.cp(), steps=STEPS,
                             warmup_steps=0, verify=True)
    out = {"report": dataclasses.asdict(report),
           "grads": summed_gradients(rank, run) if gradients else None}
    if run.dp > 1:
        # The same per-replica trial as dp1×cp2, each replica on its own CP group at once.
        mesh = dp_cp_mesh(None, dp=run.dp, device_type="cpu")
        alone = run_cp_training(MODEL, run.train_cfg(), group=mesh.cp_group,
                                cp=run.cp(chips=CHIPS // run.dp, dp=1), steps=1,
                                warmup_steps=0)
        out["replica_alone"] = dataclasses.asdict(alone)
    return out


def error_message(fn) -> str:
    try:
        fn()
    except ValueError as error:
        return str(error)
    return "no ValueError"


def mesh_facts(rank: int) -> dict:
    """Which ranks share this rank's CP group, and whether a second trial reuses it."""
    first, again = (dp_cp_mesh(None, dp=2, device_type="cpu") for _ in range(2))
    return {"cp_ranks": dist.get_process_group_ranks(first.cp_group),
            "replica": first.replica, "cp_rank": first.cp_rank,
            "cached": first.cp_group is again.cp_group,
            "dp1_is_group": dp_cp_mesh(None, dp=1, device_type="cpu").cp_group is None}


def dp_cp_job(rank: int, world_size: int, runs: tuple[Run, ...], checks: bool) -> dict:
    """Every run of a tier on this rank; the default tier (checks) adds the mesh's groups,
    verified_length under VERIFY_BUDGETS and the error messages, the slow tier (not checks)
    each run's summed gradients."""
    assert world_size == CHIPS
    out = {run.name: run_case(rank, run, gradients=not checks) for run in runs}
    if checks:
        out["mesh"] = mesh_facts(rank)
        out["verified_length"] = {name: verified_length(
            MODEL, PREFIX_CFG, group=None, cp=CPSettings(mode="p2p", chips=CHIPS, dp=2),
            device=torch.device("cpu"), budget_bytes=budget)
            for name, budget in verify_budgets().items()}
        cfg = Run(2, "p2p", "all_gather_kv", "contiguous", "replicated").train_cfg()
        out["wrong_chips"] = error_message(lambda: run_cp_training(
            MODEL, cfg, group=None, cp=CPSettings(mode="p2p", chips=8, dp=2), steps=1))
        # T = 34 splits over a replica's 2 CP chips, not into their 2 × 2 zigzag segments.
        out["indivisible"] = error_message(lambda: run_cp_training(
            MODEL, dataclasses.replace(cfg, seq_len=34), group=None,
            cp=CPSettings(mode="p2p", chips=CHIPS, dp=2, layout="zigzag"), steps=1))
    return out


# dp2×cp2 at 64 tokens: valid verify prefixes are multiples of cp_chips 2 × chunk 16 = 32.
PREFIX_CFG = TrainConfig(batch_size=GLOBAL_B // 2, seq_len=2 * T)


def verify_budgets() -> dict[str, int]:
    """Rank 0's budgets for verified_length: its state beside the reference on the 4-sequence
    global batch of 32 tokens ("tight"), or of 2 sequences (one replica's) of all 64 tokens
    ("replica_sized", what a count blind to dp would allow for the whole sequence)."""
    global_cfg = dataclasses.replace(PREFIX_CFG, batch_size=GLOBAL_B)
    resident = predict_step_memory(MODEL, global_cfg, mode="p2p", chips=2, dp=2,
                                   framework="torch").resident_state
    return {"tight": resident + verify_reference_memory(MODEL, global_cfg, seq_len=T,
                                                        framework="torch").total,
            "replica_sized": resident + verify_reference_memory(
                MODEL, PREFIX_CFG, seq_len=2 * T, framework="torch").total,
            "ample": 2**40}


@functools.cache
def results(tier: str) -> list[dict]:
    runs, checks = (DP2_RUNS, True) if tier == "default" else (SLOW_RUNS, False)
    return run_in_process_group(dp_cp_job, world_size=CHIPS, args=(runs, checks),
                                timeout_s=150 if tier == "default" else 560)


@functools.cache
def single_chip() -> dict:
    """One chip on the global batch: the first step's gradients and the losses of STEPS."""
    cfg = TrainConfig(batch_size=GLOBAL_B, seq_len=T, learning_rate=3e-3, weight_decay=0.1)
    model = build_model(MODEL, cfg)
    tokens = global_tokens_BT1()
    loss = train_step(model, _GradientsOnly(model.parameters()), tokens[:, :-1], tokens[:, 1:],
                      global_tokens=GLOBAL_B * T, dtype=cfg.dtype)
    return {"loss": loss.item(),
            "grads": {n: p.grad.numpy().copy() for n, p in model.named_parameters()},
            "losses": run_training(MODEL, cfg, steps=STEPS, warmup_steps=0).losses}


def param_bytes() -> int:
    return sum(g.nbytes for g in single_chip()["grads"].values())


def check_run(run: Run, ranks: list[dict]) -> None:
    """Losses, gradients, verify and report fields of one trial against one chip."""
    ref = single_chip()
    reports = [r["report"] for r in ranks]
    losses = reports[0]["losses"]
    assert all(r["losses"] == losses for r in reports)
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
    np.testing.assert_allclose(losses, ref["losses"], rtol=TOL, err_msg=run.name)
    assert all(r["max_rel_err"] == reports[0]["max_rel_err"] for r in reports)
    assert reports[0]["max_rel_err"] < TOL, (run.name, reports[0]["max_rel_err"])
    assert all(r["verified_seq_len"] == T for r in reports)
    assert all((r["chips"], r["dp"], r["mode"], r["layout"]) ==
               (CHIPS, run.dp, run.mode, run.layout) for r in reports)
    grads = ranks[0]["grads"]
    if grads is None:  # the default tier: verify's max_rel_err compared them on rank 0
        return
    assert list(grads) == list(ref["grads"])
    # Near-zero gradients (fast-decay heads) are held to verify's floor, as max_verify_error.
    floor = VERIFY_GRAD_FLOOR * math.sqrt(sum(float(np.sum(g * g))
                                              for g in ref["grads"].values()))
    for name, grad in ref["grads"].items():
        assert_close(f"{run.name}: grad {name}", grad, grads[name], TOL, floor=floor)


def ring_all_reduce_bytes(chips: int) -> int:
    return 2 * (chips - 1) * param_bytes() // chips


def fsdp_bytes(chips: int) -> int:
    """FSDP2's bytes per rank and step over `chips` ranks (fp32): each decoder block gathered
    in forward and backward and reduce-scattered, the root (embedding, norm, head) gathered
    once and reduce-scattered; (chips − 1) shards each, dim 0 padded to a multiple of chips."""
    model = build_model(MODEL, TrainConfig())
    in_blocks = {id(p) for m in model.modules() if isinstance(m, DecoderBlock)
                 for p in m.parameters()}
    shards = {True: 0, False: 0}
    for p in model.parameters():
        shards[id(p) in in_blocks] += math.ceil(p.shape[0] / chips) * math.prod(p.shape[1:]) * 4
    return (chips - 1) * (3 * shards[True] + 2 * shards[False])


@pytest.mark.timeout(200)
@pytest.mark.parametrize("run", DP2_RUNS, ids=lambda run: run.name)
def test_dp2_cp2_matches_one_chip_on_the_global_batch(run):
    """Losses of two AdamW steps and verify (loss and summed gradients) equal one chip's on
    the 4 × 32 global batch; the report says chips 4, dp 2."""
    check_run(run, [r[run.name] for r in results("default")])


def check_bytes(run: Run, ranks: list[dict]) -> None:
    """CP bytes of a dp2×cp2 trial equal the replica's alone (dp1×cp2); weight bytes are
    those of all 4 chips."""
    for rank, r in enumerate(ranks):
        report, alone = r["report"], r["replica_alone"]
        assert (alone["chips"], alone["dp"]) == (2, 1)
        assert report["cp_comm_bytes_per_step"] == alone["cp_comm_bytes_per_step"] > 0, rank
    weight_bytes = [r["report"]["grad_sync_bytes_per_step"] for r in ranks]
    if run.param_sharding == "replicated":
        assert weight_bytes == [ring_all_reduce_bytes(CHIPS)] * CHIPS
        assert all(r["replica_alone"]["grad_sync_bytes_per_step"] == ring_all_reduce_bytes(2)
                   for r in ranks)
    elif run.param_sharding == "zero1":  # the all-reduce, then the others' updated weights
        broadcast = [b - ring_all_reduce_bytes(CHIPS) for b in weight_bytes]
        assert sum(broadcast) == (CHIPS - 1) * param_bytes(), broadcast
    else:
        assert weight_bytes == [fsdp_bytes(CHIPS)] * CHIPS
        assert all(r["replica_alone"]["grad_sync_bytes_per_step"] == fsdp_bytes(2)
                   for r in ranks)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("run", DP2_RUNS, ids=lambda run: run.name)
def test_dp2_cp2_bytes(run):
    """CP bytes stay within the replica: each rank's equal those of the same rank in a dp1×cp2
    trial of the replica's shape. Weight bytes use all 4 chips: the gradient all-reduce is
    the 4-chip ring's; zero1's broadcasts bring the other 3 ranks' updated weights (3 × the
    weights over the 4 ranks); fsdp gathers and reduce-scatters 3 of 4 padded shards."""
    check_bytes(run, [r[run.name] for r in results("default")])


@pytest.mark.timeout(200)
def test_mesh_groups_verify_budget_and_bad_dp():
    """Ranks 0, 1 and 2, 3 form the two replicas' CP groups, built once per process; the
    verify prefix is sized for the global batch on rank 0's chip; a bad dp raises ValueError
    naming the numbers."""
    ranks = results("default")
    for rank, r in enumerate(ranks):
        facts = r["mesh"]
        assert facts["cp_ranks"] == [2 * (rank // 2), 2 * (rank // 2) + 1], rank
        assert (facts["replica"], facts["cp_rank"]) == divmod(rank, 2)
        assert facts["cached"] and facts["dp1_is_group"]
    lengths = [r["verified_length"] for r in ranks]
    assert all(length == lengths[0] for length in lengths)
    assert (lengths[0]["tight"], lengths[0]["ample"]) == (T, 2 * T), lengths[0]
    assert lengths[0]["replica_sized"] in (None, T), lengths[0]  # the global batch: not all 64
    msg = ranks[0]["wrong_chips"]
    assert "cp.chips=8 but the process group has 4 ranks (dp=2 × cp_chips=4)" in msg, msg
    msg = ranks[0]["indivisible"]
    assert "seq_len=34 is not divisible by 4 (2 × chips=2)" in msg, msg
    assert "dp=2 replicas splits the sequence over cp_chips=2 = chips=4 / dp=2" in msg, msg
    with pytest.raises(ValueError, match="dp=3 does not divide chips=4"):
        CPSettings(mode="p2p", chips=4, dp=3)


def test_shard_batch_covers_the_global_batch_once():
    """dp2×cp2 and dp1×cp4 (both layouts): replica d takes rows d·B … (d+1)·B − 1, its CP
    ranks their positions of them; together every (row, position) once."""
    tokens = torch.arange(GLOBAL_B * (T + 1)).view(GLOBAL_B, T + 1)
    for dp in (1, 2):
        for layout in ("contiguous", "zigzag"):
            seen = []
            for rank in range(CHIPS):
                inputs, targets = shard_batch(tokens, rank=rank, chips=CHIPS, layout=layout,
                                              dp=dp)
                assert inputs.shape == (GLOBAL_B // dp, T * dp // CHIPS)
                assert torch.equal(targets, inputs + 1)
                rows = inputs // (T + 1)
                assert set(rows.flatten().tolist()) == set(
                    range(rank // (CHIPS // dp) * (GLOBAL_B // dp),
                          (rank // (CHIPS // dp) + 1) * (GLOBAL_B // dp)))
                seen += inputs.flatten().tolist()
            assert sorted(seen) == tokens[:, :-1].flatten().tolist(), (dp, layout)
    with pytest.raises(ValueError, match="a global batch of 4 sequences does not split over "
                                         "dp=3 replicas"):
        shard_batch(tokens, rank=0, chips=3, dp=3)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("run", SLOW_RUNS, ids=lambda run: run.name)
def test_dp_cp_matrix_matches_one_chip(run):
    """dp1×cp4 for every GDN mode (dp = 1 unchanged at 4 ranks) and the rest of the dp2×cp2
    mode × param_sharding matrix: losses, verify and every summed gradient against one chip
    on the same global batch."""
    ranks = [r[run.name] for r in results("slow")]
    check_run(run, ranks)
    if run.dp > 1:
        check_bytes(run, ranks)
    else:
        assert all(r["report"]["grad_sync_bytes_per_step"] == ring_all_reduce_bytes(CHIPS)
                   for r in ranks)
