"""Plan trials: compile the JAX CP step for a trial's chips in a fresh process, run nothing.

A plan needs no chips: a Ray task on one CPU starts `python -m gdn_core.jax_gdn.plan`, whose
process gets the trial's chip count as virtual CPU devices (JAX fixes its device count when
its backend starts, so each plan has its own process) and prints XLA's memory analysis, the
compiled matmul FLOPs and the collective bytes as JSON. Whatever the trial's accelerator, the
compile is XLA:CPU's — the program and collectives a TPU or GPU would run, with buffer sizes
that differ by backend — so the memory is labelled an estimate of that chip's, never a peak.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import ray

from gdn_core.flops.executed import hardware_flops_per_step
from gdn_core.flops.maxtext import maxtext_model_flops_per_step
from gdn_core.flops.model import model_flops_per_step
from gdn_core.memory.step import predict_step_memory

from .compile_cache import jax_cache_env
from .environment import process_environment
from .grid import TrialSpec
from .metrics import trial_documents
from .process_probe import software_versions
from .result import TrialMetrics

ERROR_TAIL_CHARS = 2000


def plan_request(trial: TrialSpec) -> dict:
    """What `python -m gdn_core.jax_gdn.plan --request` takes for `trial` (the planner
    compiles the gdn_only contiguous step: its CP settings are the mode, all the mesh's
    chips and its dp replicas, batch_size sequences each; its packed documents are a constant
    of the step's program, compiled like any other setting)."""
    cp = trial.cp_settings()
    return {"preset": trial.preset, "num_layers": trial.num_layers,
            "vocab_size": trial.vocab_size, "seq_len": trial.seq_len, "chips": cp.chips,
            "dp": cp.dp, "mode": cp.mode, "batch_size": trial.batch_size, "dtype": trial.dtype,
            "param_sharding": trial.param_sharding, "remat": trial.remat,
            "documents": trial.documents}


def plan_in_fresh_process(request: dict, *, budget_bytes: int | None = None,
                          max_seq_len: int | None = None, timeout_s: float | None = None,
                          compile_cache_dir: str = "") -> dict:
    """The JSON `python -m gdn_core.jax_gdn.plan` prints for `request` (with a budget: the
    bisection's FitSearch); RuntimeError with the child's stderr tail when it fails."""
    argv = [sys.executable, "-m", "gdn_core.jax_gdn.plan", "--request", json.dumps(request)]
    if budget_bytes is not None:
        argv += ["--budget-bytes", str(budget_bytes), "--max-seq-len", str(max_seq_len)]
    env = {**os.environ, **jax_cache_env(compile_cache_dir), "JAX_PLATFORMS": "cpu"}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the plan's compile ran past {timeout_s:g} s") from None
    if done.returncode != 0:
        raise RuntimeError(f"the plan's compile exited {done.returncode}: "
                           f"{done.stderr[-ERROR_TAIL_CHARS:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


BACKSTOP_S = 60.0
"""How long the child may outlive the trial's timeout: the runner's own timeout (killing this
task, and with it the child) fires first; this only bounds a child left on its own."""


@ray.remote(num_cpus=1, max_retries=0)
def compile_plan(request: dict, *, timeout_s: float, compile_cache_dir: str = "") -> dict:
    """The plan's JSON, the host, the software versions and the environment (XLA:CPU
    compiles it, so the device runtime is a CPU's: none) (plan_in_fresh_process)."""
    plan = plan_in_fresh_process(request, timeout_s=timeout_s + BACKSTOP_S,
                                 compile_cache_dir=compile_cache_dir)
    return {"plan": plan, "host": socket.gethostname(), "versions": software_versions(),
            "environment": process_environment(accelerator_kind="cpu", framework="jax")}


def estimate_source(trial: TrialSpec, plan: dict) -> str:
    target = "CPU" if trial.accelerator_kind == "cpu" else trial.accelerator_type
    mesh = f" (dp {trial.dp} × cp {trial.chips // trial.dp})" if trial.dp > 1 else ""
    return (f"xla_memory_analysis: XLA:{plan['backend'].split()[0].upper()} compile for "
            f"{trial.chips} virtual chips{mesh} (an estimate of a {target} chip's)")


def plan_metrics(trial: TrialSpec, plan: dict) -> TrialMetrics:
    """A plan trial's figures: XLA's estimate, the HLO's bytes and FLOPs, the analytic counts
    and prediction; nothing measured (no step time, MFU or peak). Counted as a measured
    trial's are (metrics.trial_metrics): the FLOPs of every replica's sequences, the
    prediction of a replica's chips with the weights over all dp × cp of them."""
    model_cfg, cp = trial.to_model_config(), trial.cp_settings()
    batch, seq_len = trial.global_batch_size, trial.seq_len
    documents = trial_documents(trial)  # attention counted per document, as in trial_metrics
    predicted = predict_step_memory(model_cfg.stand_in, trial.to_train_config(), mode=cp.mode,
                                    chips=cp.cp_chips, dp=cp.dp, framework="jax",
                                    attn_cp=cp.attn_cp, layout=cp.layout)
    cp_bytes, sync_bytes = plan["cp_comm_bytes_per_step"], plan["grad_sync_bytes_per_step"]
    return TrialMetrics(
        model_flops_per_step=float(model_flops_per_step(
            model_cfg, batch=batch, seq_len=seq_len, cu_seqlens=documents).total),
        maxtext_flops_per_step=float(maxtext_model_flops_per_step(
            model_cfg, batch=batch, seq_len=seq_len).total),
        hardware_flops_per_step=float(hardware_flops_per_step(
            model_cfg, mode=cp.mode, chips=cp.cp_chips, batch=batch, seq_len=seq_len,
            framework="jax", remat=trial.remat, attn_cp=cp.attn_cp, layout=cp.layout,
            kernels=cp.kernels, cu_seqlens=documents).total),
        compiled_flops_per_step_per_chip=float(plan["matmul_flops_per_chip"]),
        compile_time_s=plan["compile_time_s"],
        estimated_memory_bytes_per_chip=plan["estimated_memory_bytes"],
        estimated_memory_source=estimate_source(trial, plan),
        predicted_memory_bytes_per_chip=predicted.total,
        comm_bytes_per_step_per_chip=cp_bytes + sync_bytes,
        cp_comm_bytes_per_step_per_chip=cp_bytes,
        grad_sync_bytes_per_step_per_chip=sync_bytes,
    )


__all__ = ["compile_plan", "estimate_source", "plan_metrics", "plan_request"]
