"""JAX context-parallel training step and runner against the single-chip step, and its bytes.

Legend: B batch, T global tokens, D chips, L layers. Oracle: gdn_core.jax_gdn.train's
single-chip step on the same weights and tokens. The CP step of each (mode, layout) is compiled
once, by compile_cp_train_step, which run_cp_training calls too (equal arguments reuse the
compile within a process).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from gdn_core.config import AttentionConfig, GDNConfig, ModelConfig
from gdn_core.cp_modes import CPSettings, check_attention_cp_shape, check_cp_shape
from gdn_core.jax_gdn.cp import make_cp_train_step, run_cp_training
from gdn_core.jax_gdn.cp.step import cp_training_inputs, mesh_cp, synthetic_batch
from gdn_core.jax_gdn.cp.train import compile_cp_train_step
from gdn_core.jax_gdn.cp.verify import verify_against_single_chip
from gdn_core.jax_gdn.params import init_model_params
from gdn_core.jax_gdn.train import make_optimizer, make_train_step
from gdn_core.memory.step import predict_step_memory
from gdn_core.memory.verify import verify_reference_memory
from gdn_core.testing import assert_close
from gdn_core.train_config import PARAM_SHARDINGS, REMATS, TrainConfig

# GQA r = 2, heads divisible by 4 (ulysses); T/D = 60, 30: not multiples of the 16-token chunk.
CFG = GDNConfig(hidden_size=32, num_k_heads=4, num_v_heads=8, head_k_dim=8, head_v_dim=16,
                conv_kernel_size=4, chunk_size=16)
MODEL = ModelConfig(name="cp-test", gdn=CFG, num_layers=2, intermediate_size=64, vocab_size=64)
# Adam's first update is ±lr per element (g/|g|): an element whose gradient is within round-off
# of zero may flip sign between CP and one chip. lr = 1e-5 keeps such a flip (2e-5) under 1e-4
# of the smallest weight's norm (in_proj_b, ~0.3); the gradients themselves are checked
# through AdamW's moments (mu = 0.1·g, nu = 0.001·g²) at the same tolerance.
TRAIN = TrainConfig(batch_size=2, seq_len=120, learning_rate=1e-5, weight_decay=0.1, seed=3)
TOL = 1e-4
LAYOUTS = {"D2": 2, "D4": 4, "D8": 8}
CASES = [("ulysses", "D2"), ("p2p", "D2"), ("all_gather", "D2"), ("log_scan", "D2"),
         pytest.param("ulysses", "D4", marks=pytest.mark.slow),
         pytest.param("log_scan", "D4", marks=pytest.mark.slow)]


def mesh_of(layout):
    return Mesh(np.array(jax.devices()[:LAYOUTS[layout]]), ("cp",))


def leaves(tree):
    return [(jax.tree_util.keystr(path), leaf)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)]


@functools.cache
def single_chip_step():
    params = init_model_params(MODEL, jax.random.PRNGKey(TRAIN.seed))
    opt_state = make_optimizer(TRAIN).init(params)
    tokens_BT1 = synthetic_batch(MODEL, TRAIN)
    args = (params, opt_state, tokens_BT1[:, :-1], tokens_BT1[:, 1:])
    step = make_train_step(MODEL, TRAIN, global_tokens=TRAIN.batch_size * TRAIN.seq_len)
    return jax.device_get(step.lower(*args).compile()(*args))


def parameter_count():
    return sum(x.size for x in jax.tree.leaves(init_model_params(MODEL, jax.random.PRNGKey(0))))


def expected_cp_bytes(mode, D, T):
    """Most bytes any chip receives per step outside the gradient sync: docs/architecture.md's
    table per layer and direction (forward + backward), plus the conv halo, times L, plus the
    loss psum (a ring all-reduce of one float32). Every mode's state traffic is in float32."""
    g, t = MODEL.gdn, T // D
    state = TRAIN.batch_size * g.num_v_heads * g.head_k_dim * g.head_v_dim * 4
    pair = TRAIN.batch_size * g.num_v_heads * g.head_k_dim * (g.head_k_dim + g.head_v_dim) * 4
    loss = 2 * (D - 1) * 4 // D
    if mode == "ulysses":  # pre-conv q, k, v and a, b out, o back; the same again backward
        channels = 2 * g.key_dim + 2 * g.value_dim + 2 * g.num_v_heads
        return MODEL.num_layers * 2 * (D - 1) * TRAIN.batch_size * t * channels * 4 // D + loss
    halo = TRAIN.batch_size * (g.conv_kernel_size - 1) * g.conv_dim * 4
    shifts = [2 ** r for r in range(math.ceil(math.log2(D)))]
    exchange = {  # per chip j, forward + backward (test_jax_cp.expected_received_bytes)
        "p2p": lambda j: state * ((j >= 1) + (j <= D - 2)),
        "all_gather": lambda j: 2 * (D - 1) * pair,
        "log_scan": lambda j: sum(pair * (j >= d) + (j + d < D) * (
            state if d == shifts[-1] else pair) for d in shifts),
    }[mode]
    return max(MODEL.num_layers * (exchange(j) + halo * ((j >= 1) + (j <= D - 2)))
               for j in range(D)) + loss


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode,layout", CASES)
def test_one_step_matches_single_chip(mode, layout):
    mesh = mesh_of(layout)
    step = compile_cp_train_step(MODEL, TRAIN, mesh=mesh, axis="cp",
                                 cp=CPSettings(mode=mode, chips=mesh.devices.size)).compiled
    params, opt_state, loss = jax.device_get(
        step(*cp_training_inputs(MODEL, TRAIN, mesh=mesh, axis="cp")))
    params_ref, opt_state_ref, loss_ref = single_chip_step()
    assert_close("loss", loss_ref, loss, TOL)
    for (name, ref), (_, got) in zip(leaves(params_ref), leaves(params), strict=True):
        assert_close(f"params{name}", ref, got, TOL)
    for (name, ref), (_, got) in zip(leaves(opt_state_ref), leaves(opt_state), strict=True):
        assert_close(f"opt_state{name}", ref, got, TOL)


# The report's figures per mode; every mode's step runs by default in the test above.
REPORT_CASES = [case if case in (("ulysses", "D2"), ("p2p", "D2"))
                else pytest.param(*getattr(case, "values", case), marks=pytest.mark.slow)
                for case in CASES]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode,layout", REPORT_CASES)
def test_run_cp_training_report(mode, layout):
    D = LAYOUTS[layout]
    report = run_cp_training(MODEL, TRAIN, mesh=mesh_of(layout), axis="cp",
                             cp=CPSettings(mode=mode, chips=D), steps=2, warmup_steps=1)
    assert (report.mode, report.chips) == (mode, D)
    assert (report.attn_cp, report.layout) == (None, "contiguous")  # gdn_only: no attention
    # what ran, as the step resolved it (a trial's result stores these)
    assert (report.gdn_kernel, report.attention_kernel) == ("reference jax chunk rule", None)
    assert len(report.losses) == 3 and np.isfinite(report.losses).all()
    assert_close("first loss", single_chip_step()[2], report.losses[0], TOL)
    assert len(report.step_times_s) == 2 and min(report.step_times_s) > 0
    # Measured (this process's RSS, shared over its D chips) and XLA's estimate, each named.
    assert report.memory_source == f"process_rss_peak/{D}_chips"
    assert report.peak_memory_bytes > 0
    assert report.estimated_memory_source == "xla_memory_analysis"
    assert 0 < report.estimated_memory_bytes < report.peak_memory_bytes  # RSS holds the runtime
    assert report.compile_time_s > 0
    assert report.comm_source == "xla_hlo"
    assert report.cp_comm_bytes_per_step == expected_cp_bytes(mode, D, TRAIN.seq_len)
    assert report.grad_sync_bytes_per_step == 2 * (D - 1) * 4 * parameter_count() // D
    assert report.max_rel_err is None


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["log_scan", pytest.param("p2p", marks=pytest.mark.slow),
                                  pytest.param("all_gather", marks=pytest.mark.slow)])
def test_cp_bytes_independent_of_seq_len(mode):
    # Twice the tokens at D = 2 (compiled, not run): the sequence-sharded modes exchange
    # states, pairs and the halo only, so the bytes are those of T = 120 (formula and
    # test_run_cp_training_report); the gradient sync does not depend on T either.
    train_cfg = dataclasses.replace(TRAIN, seq_len=2 * TRAIN.seq_len)
    program = compile_cp_train_step(MODEL, train_cfg, mesh=mesh_of("D2"), axis="cp",
                                    cp=CPSettings(mode=mode, chips=2))
    assert program.cp_comm_bytes_per_step == expected_cp_bytes(mode, 2, TRAIN.seq_len)
    assert program.cp_comm_bytes_per_step == expected_cp_bytes(mode, 2, train_cfg.seq_len)
    assert program.grad_sync_bytes_per_step == 4 * parameter_count()


@pytest.mark.slow  # D = 4: verify on D = 2 runs by default (the prefix test below)
@pytest.mark.timeout(240)
def test_verify_against_single_chip():
    report = run_cp_training(MODEL, TRAIN, mesh=mesh_of("D4"), axis="cp",
                             cp=CPSettings(mode="log_scan", chips=4), steps=1, warmup_steps=0,
                             verify=True)
    assert report.max_rel_err is not None and report.max_rel_err < TOL
    assert report.verified_seq_len == TRAIN.seq_len  # this host holds the whole sequence


@pytest.mark.timeout(240)
def test_verify_on_the_prefix_one_chip_holds():
    # D = 2 × chunk 16: valid prefixes of the 120 tokens are 32, 64 and 96. A budget that
    # holds the step's state and the reference on 64 tokens, not on 96, verifies 64; none,
    # nothing (an ample one verifies the whole sequence: test_verify_against_single_chip).
    mesh, D = mesh_of("D2"), 2
    resident = predict_step_memory(MODEL, TRAIN, mode="p2p", chips=D,
                                   framework="jax").resident_state
    reference = verify_reference_memory(MODEL, TRAIN, seq_len=64, framework="jax").total
    p2p = CPSettings(mode="p2p", chips=D)
    tight = run_cp_training(MODEL, TRAIN, mesh=mesh, axis="cp", cp=p2p, steps=1,
                            warmup_steps=0, verify=True,
                            verify_memory_budget_bytes=resident + reference)
    assert tight.verified_seq_len == 64
    assert tight.max_rel_err is not None and tight.max_rel_err < TOL
    nothing = run_cp_training(MODEL, TRAIN, mesh=mesh, axis="cp", cp=p2p, steps=1,
                              warmup_steps=0, verify=True, verify_memory_budget_bytes=0)
    assert nothing.verified_seq_len is None and nothing.max_rel_err is None


@pytest.mark.timeout(60)
def test_validation_errors_name_numbers():
    mesh, p2p = mesh_of("D4"), CPSettings(mode="p2p", chips=4)
    train_cfg = TrainConfig(batch_size=1, seq_len=118)
    with pytest.raises(ValueError, match="seq_len=118 is not divisible by chips=4"):
        run_cp_training(MODEL, train_cfg, mesh=mesh, axis="cp", cp=p2p, steps=1)
    with pytest.raises(ValueError, match="mode='ring' is not one of"):
        make_cp_train_step(MODEL, TRAIN, mesh=mesh, axis="cp",
                           cp=CPSettings(mode="ring", chips=mesh.devices.size))
    with pytest.raises(ValueError, match=r"steps=0 must be >= 1"):
        run_cp_training(MODEL, TRAIN, mesh=mesh, axis="cp", cp=p2p, steps=0)
    with pytest.raises(ValueError, match=r"cp.chips=2 but mesh axis 'cp' spans 4 chips"):
        run_cp_training(MODEL, TRAIN, mesh=mesh, axis="cp", cp=CPSettings(mode="p2p", chips=2),
                        steps=1)


def count_calls(monkeypatch, fn, within: tuple[str, ...] = ("gdn_core",)) -> list:
    """Count fn's calls from every module under `within` that bound it by name (a `from …
    import`); returns the list each call appends to."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(args or kwargs)
        return fn(*args, **kwargs)

    for module in [m for name, m in sys.modules.items() if name.startswith(within)]:
        for name, value in list(vars(module).items()):
            if value is fn:
                monkeypatch.setattr(module, name, counted)
    return calls


# One GDN layer then one gated attention layer: both kinds of CP layer in one trial.
HYBRID = ModelConfig(
    name="cp-hybrid-test", gdn=GDNConfig(hidden_size=32, num_k_heads=4, num_v_heads=8,
                                         head_k_dim=8, head_v_dim=8, chunk_size=16),
    num_layers=2, intermediate_size=64, vocab_size=64, layers="hybrid",
    attention=AttentionConfig(num_heads=8, num_kv_heads=2, head_dim=8,
                              partial_rotary_factor=0.5, full_attention_interval=2))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("model_cfg, cp, verify, attention_checks", [
    # The report test's program (compiled already), so only the counting costs time.
    (MODEL, CPSettings(mode="p2p", chips=2), False, 0),
    # Both kinds of layer, verify's own programs too: four compiles of their own.
    pytest.param(HYBRID, CPSettings(mode="log_scan", chips=2, attn_cp="ulysses",
                                    layout="zigzag"), True, 1, marks=pytest.mark.slow),
], ids=["gdn_only", "hybrid-verify"])
def test_a_trial_validates_its_settings_once(monkeypatch, model_cfg, cp, verify,
                                             attention_checks):
    # run_cp_training checks the shape once (step.mesh_cp: CPSettings.check_shape, the one
    # copy of the GDN and attention rules), not again for verify, the compile, the comm
    # reference, or in each layer or rule at every trace (issue 22: it was 6 whole checks,
    # plus 9 layer, 9 attention and 3 rule checks).
    # (the memory predictor verify asks checks its own arguments: not the step's, not counted)
    step_modules = ("gdn_core.cp_modes", "gdn_core.jax_gdn")
    counts = {fn.__name__: count_calls(monkeypatch, fn, step_modules) for fn in (
        mesh_cp, check_cp_shape, check_attention_cp_shape)}
    train_cfg = TRAIN if model_cfg is MODEL else TrainConfig(batch_size=1, seq_len=64, seed=3)
    report = run_cp_training(model_cfg, train_cfg, mesh=mesh_of("D2"), axis="cp", cp=cp,
                             steps=1, warmup_steps=0, verify=verify)
    assert report.max_rel_err is None if not verify else report.max_rel_err < TOL
    assert {name: len(calls) for name, calls in counts.items()} == {
        "mesh_cp": 1,  # the one validation, which runs the two below once each
        "check_cp_shape": 1, "check_attention_cp_shape": attention_checks}


def weight_traffic_bytes(sharding, remat, D):
    """Float32 bytes a chip receives per step for the weights (no leaf of MODEL stays whole:
    every one has a dim divisible by 2, 4 and 8). Ring convention, S = all parameters' bytes:
    replicated: all-reduce 2·(D−1)/D·S; zero1: reduce-scatter + all-gather, the same;
    fsdp: reduce-scatter (D−1)/D·S plus one gather of every weight where used, and one more in
    backward of what backward needs again: every layer weight under remat full/gdn, only the
    matmul weights under none (the other layer leaves' derived values are saved)."""
    params = init_model_params(MODEL, jax.random.PRNGKey(0))
    size = lambda tree: 4 * sum(x.size for x in jax.tree.leaves(tree))  # noqa: E731
    share = (D - 1) / D
    if sharding != "fsdp":
        return round(2 * share * size(params))
    layers = params["block"][0]
    matmuls = [layers["gdn"][name] for name in ("in_proj_qkv", "in_proj_z", "in_proj_b",
                                                 "in_proj_a", "out_proj")] + [layers["mlp"]]
    regathered = size(layers) if remat != "none" else size(matmuls)
    return round(share * (2 * size(params) + regathered))


WEIGHT_CASES = [(layout, sharding, remat) for layout in LAYOUTS
                for sharding in PARAM_SHARDINGS for remat in REMATS]
# fsdp in the default tier (replicated: the tests above; fsdp with remat full:
# test_cp_step_on_correlated_keys); zero1 (21 s cold), the other remats, D = 4 and 8 in the
# slow tier.
CI_WEIGHT_CASES = {("D2", "fsdp", "none")}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout,sharding,remat", [
    case if case in CI_WEIGHT_CASES else pytest.param(*case, marks=pytest.mark.slow)
    for case in WEIGHT_CASES])
def test_weight_layout_and_remat_match_single_chip(layout, sharding, remat):
    # One AdamW step under (param_sharding, remat) equals the replicated one-chip step, the
    # weights' bytes are reported apart from the CP exchanges, and verify works.
    D, mesh = LAYOUTS[layout], mesh_of(layout)
    train_cfg = dataclasses.replace(TRAIN, param_sharding=sharding, remat=remat)
    program = compile_cp_train_step(MODEL, train_cfg, mesh=mesh, axis="cp",
                                    cp=CPSettings(mode="log_scan", chips=mesh.devices.size))
    inputs = cp_training_inputs(MODEL, train_cfg, mesh=mesh, axis="cp")
    error = verify_against_single_chip(inputs[0], synthetic_batch(MODEL, train_cfg), MODEL,
                                       train_cfg, mesh=mesh, axis="cp",
                                       cp=CPSettings(mode="log_scan", chips=mesh.devices.size))
    assert error < TOL
    params, opt_state, loss = jax.device_get(program.compiled(*inputs))
    params_ref, opt_state_ref, loss_ref = single_chip_step()
    assert_close("loss", loss_ref, loss, TOL)
    for (name, ref), (_, got) in zip(leaves(params_ref), leaves(params), strict=True):
        assert_close(f"params{name}", ref, got, TOL)
    for (name, ref), (_, got) in zip(leaves(opt_state_ref), leaves(opt_state), strict=True):
        assert_close(f"opt_state{name}", ref, got, TOL)
    assert program.grad_sync_bytes_per_step == weight_traffic_bytes(sharding, remat, D)
    cp_bytes = expected_cp_bytes("log_scan", D, TRAIN.seq_len)
    if remat == "none":
        assert program.cp_comm_bytes_per_step == cp_bytes
    else:  # backward runs the rule's forward (its exchanges) again
        assert cp_bytes < program.cp_comm_bytes_per_step < 2 * cp_bytes


# Two processes × 2 CPU chips, one 4-chip mesh (gloo collectives): each process feeds only its
# own chips. The configs travel as JSON; the report comes back as the last line of stdout.
WORKER = """
import dataclasses, json, sys
import jax
jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
port, process_id, model, train, mode = sys.argv[1:]
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=int(process_id))
import numpy as np
from jax.sharding import Mesh
from gdn_core.config import GDNConfig, ModelConfig
from gdn_core.cp_modes import CPSettings
from gdn_core.jax_gdn.cp import run_cp_training
from gdn_core.train_config import PARAM_SHARDINGS, REMATS, TrainConfig
model = json.loads(model)
model_cfg = ModelConfig(**{**model, "gdn": GDNConfig(**model["gdn"])})
report = run_cp_training(model_cfg, TrainConfig(**json.loads(train)),
                         mesh=Mesh(np.array(jax.devices()), ("cp",)), axis="cp",
                         cp=CPSettings(mode=mode, chips=4), steps=2, verify=True)
print(json.dumps(dataclasses.asdict(report)), flush=True)
jax.distributed.shutdown()
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_run_cp_training_across_two_processes():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    configs = [json.dumps(dataclasses.asdict(cfg)) for cfg in (MODEL, TRAIN)]
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(port), str(i), *configs,
                                 "p2p"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, cwd=pathlib.Path(__file__).parents[2])
               for i in range(2)]
    outputs = [worker.communicate(timeout=840) for worker in workers]
    for worker, (_, err) in zip(workers, outputs):
        assert worker.returncode == 0, err[-3000:]
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert reports[0]["losses"] == reports[1]["losses"]
    single = run_cp_training(MODEL, TRAIN, mesh=Mesh(np.array(jax.devices()[:4]), ("cp",)),
                             axis="cp", cp=CPSettings(mode="p2p", chips=4), steps=2)
    for report in reports:
        assert report["chips"] == 4 and report["max_rel_err"] < TOL
        # Both processes agree on what to verify (the smallest budget of the two).
        assert report["verified_seq_len"] == TRAIN.seq_len
        assert report["memory_source"] == "process_rss_peak/2_chips"
        assert_close("losses", single.losses, report["losses"], TOL)
        assert report["cp_comm_bytes_per_step"] == expected_cp_bytes("p2p", 4, TRAIN.seq_len)
        assert report["grad_sync_bytes_per_step"] == 2 * 3 * 4 * parameter_count() // 4


CORRELATED_CASES = [("p2p", "fsdp", "full"),
                    pytest.param("ulysses", "replicated", "none", marks=pytest.mark.slow),
                    pytest.param("all_gather", "zero1", "gdn", marks=pytest.mark.slow),
                    pytest.param("log_scan", "replicated", "full", marks=pytest.mark.slow)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode, sharding, remat", CORRELATED_CASES)
def test_cp_step_on_correlated_keys(mode, sharding, remat):
    """The CP step's loss and gradients equal one chip's when a head's keys share a direction:
    the weights of test_torch_step_settings.realistic_gdn, through the state_dict conversion."""
    import torch

    from gdn_core.jax_gdn.params import from_state_dict
    from gdn_core.torch_gdn import GDNLanguageModel

    from .test_torch_step_settings import mean_key_cosine, realistic_gdn

    torch_model = realistic_gdn(GDNLanguageModel(MODEL, seed=TRAIN.seed))
    train_cfg = dataclasses.replace(TRAIN, param_sharding=sharding, remat=remat)
    tokens_BT1 = synthetic_batch(MODEL, train_cfg)
    assert mean_key_cosine(torch_model, torch.from_numpy(tokens_BT1[:, :-1]).long()) > 0.6
    mesh = mesh_of("D2")
    params, *_ = cp_training_inputs(MODEL, train_cfg, mesh=mesh, axis="cp",
                                    params=from_state_dict(torch_model.state_dict()))
    err = verify_against_single_chip(params, tokens_BT1, MODEL, train_cfg, mesh=mesh, axis="cp",
                                     cp=CPSettings(mode=mode, chips=mesh.devices.size))
    assert err < TOL, f"{mode} {sharding} remat={remat}: {err:.2e}"
