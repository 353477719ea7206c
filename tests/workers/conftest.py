"""Ray fixtures for the workers tests: one local Ray shared by the modules that need it.

The local Ray has 8 virtual CPU chips on 2 CPUs (`cpu_chip` resources): more chips than cores,
so trials of up to 8 chips fit (chips share cores; `gdn-sweep run` would advertise one per core
and warn). test_cpu_partition.py builds a Ray with one chip per core for what needs a real
partition. The modules that build a Ray of their own (their `STARTS_ITS_OWN_RAY`) shut the
shared one down, so they run after every other workers module: one shared start, not one after
each of them.
"""

from __future__ import annotations

import threading
import time

import pytest
import ray

from workers.grid import TrialSpec
from workers.sweep_spec import SweepSpec

OUR_ACTOR_CLASSES = ("TorchRankActor", "JaxHostActor")


def pytest_collection_modifyitems(items) -> None:
    """Move the workers modules that start their own Ray after the rest (a stable sort of the
    workers items among their own positions; other items stay where they are)."""
    places = [i for i, item in enumerate(items) if item.nodeid.startswith("tests/workers/")]
    ordered = sorted((items[i] for i in places),
                     key=lambda item: getattr(item.module, "STARTS_ITS_OWN_RAY", False))
    for i, item in zip(places, ordered, strict=True):
        items[i] = item


@pytest.fixture(scope="module")
def local_ray():
    from workers.cluster import connect_ray

    if ray.is_initialized() and "cpu_chip" not in ray.cluster_resources():
        ray.shutdown()
    return connect_ray("", cpu_chips=8, num_cpus=2)


def tiny_spec(**overrides) -> SweepSpec:
    """A sweep of 1-layer tiny-model torch trials: seconds each on this machine."""
    fields = dict(name="test", frameworks=["torch"], modes=["all_gather"], chips=[1],
                  seq_lens=[64], model={"preset": "tiny", "num_layers": 1}, steps=2,
                  warmup_steps=1, trial_timeout_s=120.0)
    fields.update(overrides)
    return SweepSpec(**fields)


class MemorySink:
    """A ResultSink in memory (the protocol of workers.result_sink), optionally pre-finished keys."""

    def __init__(self, finished: set[str] | None = None) -> None:
        self.finished = set(finished or ())
        self.started: list[str] = []
        self.results = []
        self._lock = threading.Lock()

    def finished_keys(self) -> set[str]:
        return set(self.finished)

    def trial_started(self, trial: TrialSpec) -> None:
        with self._lock:
            self.started.append(trial.key)

    def trial_finished(self, result) -> None:
        with self._lock:
            self.results.append(result)

    def by_key(self) -> dict:
        return {r.trial.key: r for r in self.results}


def live_leftovers() -> tuple[list, list]:
    """Placement groups not removed, and our actors still alive."""
    from ray.util.state import list_actors

    groups = [g for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]
    actors = [a for a in list_actors(address=ray.get_runtime_context().gcs_address,
                                     filters=[("state", "!=", "DEAD")], limit=1000)
              if a.class_name in OUR_ACTOR_CLASSES]
    return groups, actors


def assert_no_leaks(timeout_s: float = 20.0) -> None:
    """Every placement group of finished trials removed, every rank / host actor dead."""
    deadline = time.monotonic() + timeout_s
    while True:
        groups, actors = live_leftovers()
        if not groups and not actors:
            return
        if time.monotonic() > deadline:
            ids = [g["placement_group_id"] for g in groups]
            raise AssertionError(f"leaked placement groups {ids} / actors "
                                 f"{[(a.class_name, a.state) for a in actors]}")
        time.sleep(0.5)


def assert_consistent_metrics(result) -> None:
    """The invariants every succeeded trial's metrics satisfy (docs/architecture.md, Metrics)."""
    import math

    t, m = result.trial, result.metrics
    assert result.status == "succeeded", (t.key, result.status, result.error)
    assert m.step_time_s > 0
    assert math.isclose(m.tokens_per_s_per_chip * m.step_time_s * t.chips,
                        t.global_batch_size * t.seq_len, rel_tol=1e-9)
    assert math.isfinite(m.loss_first) and math.isfinite(m.loss_last)
    assert m.model_flops_per_step > 0 and m.maxtext_flops_per_step > 0
    assert m.hardware_flops_per_step >= m.model_flops_per_step
    assert m.peak_flops_per_chip > 0 and m.peak_flops_source
    assert 0 < m.mfu <= m.hfu
    assert m.peak_memory_bytes_per_chip > 0 and m.memory_source
    assert m.predicted_memory_bytes_per_chip > 0
    assert m.comm_bytes_per_step_per_chip == (m.cp_comm_bytes_per_step_per_chip
                                              + m.grad_sync_bytes_per_step_per_chip)
    if t.chips > 1:
        assert m.grad_sync_bytes_per_step_per_chip > 0
    if t.chips > t.dp:  # a CP group of more than one chip exchanges
        assert m.cp_comm_bytes_per_step_per_chip > 0
    assert set(result.versions) >= {"python", "torch", "jax", "jaxlib", "ray", "gdn-sweep"}
    assert result.hosts and result.attempts >= 1
    assert result.started_at <= result.finished_at
