"""workers.environment: what a worker process says about itself, how a trial's processes are
merged, version numbers as the runtimes encode them, and the sweep's source (a submitted Ray
job recognised from the variable Ray's job supervisor sets)."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import subprocess
from pathlib import Path

import pytest

from workers.environment import (
    SweepSource,
    cuda_version_text,
    cudnn_version_text,
    merge_environments,
    nvidia_driver_version,
    process_environment,
    project_identity,
    trial_environment,
)

CHECKOUT = Path(__file__).resolve().parents[2]


def test_a_cpu_process_names_its_packages_and_no_device_runtime():
    env = process_environment(accelerator_kind="cpu", framework="torch")
    assert env["python"] == platform.python_version()
    for name in ("torch", "jax", "jaxlib", "ray"):
        assert env["packages"][name] == importlib.metadata.version(name)
    assert set(env["packages"]) == {"torch", "jax", "jaxlib", "ray", "fla-core"}
    assert set(env["runtime"].values()) == {None}


def test_the_project_commit_is_the_checkouts_head():
    head = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=False).stdout.strip()
    if not head:
        pytest.skip("this copy of the project is not a git checkout")
    identity = project_identity()
    assert identity["git_commit"] == head and identity["git_dirty"] in (True, False)
    assert identity["version"] == importlib.metadata.version("gdn-sweep")


def test_processes_that_agree_merge_to_their_value_and_differences_stay_on_record():
    one = {"python": "3.11.7", "runtime": {"cuda": "12.8", "nvidia_driver": "550.54.15"}}
    other = {"python": "3.11.7", "runtime": {"cuda": "12.8", "nvidia_driver": "560.28.03"}}
    assert merge_environments([one, one]) == one
    assert merge_environments([one, other]) == {
        "python": "3.11.7", "runtime": {"cuda": "12.8",
                                        "nvidia_driver": "550.54.15 | 560.28.03"}}
    whole = trial_environment(one, accelerator_kind="gpu", accelerator_type="h100",
                              device_name="NVIDIA H100 80GB HBM3", host_count=2,
                              source={"kind": "cli"})
    assert whole["accelerator"]["host_count"] == 2 and whole["source"] == {"kind": "cli"}


@pytest.mark.parametrize("encoded, text", [(12080, "12.8"), (11080, "11.8"), (None, None)])
def test_cuda_versions_read_as_major_minor(encoded, text):
    assert cuda_version_text(encoded) == text


@pytest.mark.parametrize("encoded, text", [(90100, "9.1.0"), (91002, "9.10.2"), (8902, "8.9.2"),
                                           (None, None)])
def test_cudnn_versions_read_as_major_minor_patch(encoded, text):
    assert cudnn_version_text(encoded) == text


def test_the_nvidia_driver_is_read_from_the_kernel_modules_file(tmp_path):
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 "
                    "22:23:56 UTC 2024\nGCC version:  gcc version 12.2.0\n")
    assert nvidia_driver_version(proc) == "550.54.15"
    open_module = tmp_path / "open"
    open_module.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  "
                           "570.86.15  Release Build\n")
    assert nvidia_driver_version(open_module) == "570.86.15"
    assert nvidia_driver_version(tmp_path / "absent") is None


def test_the_source_names_a_schedule_and_a_submitted_ray_job(monkeypatch):
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert SweepSource(kind="api").describe() == {"kind": "api"}
    assert SweepSource(kind="schedule", schedule_id=7).describe() == {
        "kind": "schedule", "schedule_id": 7}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(
        {"runtime_env": {}, "metadata": {"job_submission_id": "raysubmit_abc"}}))
    job = SweepSource(kind="cli").describe()  # `gdn-sweep run` as a `ray job submit` entrypoint
    assert job["kind"] == "ray_job" and job["submission_id"] == "raysubmit_abc"
    with pytest.raises(ValueError, match="schedule_id=None goes with kind 'schedule'"):
        SweepSource(kind="schedule")
    with pytest.raises(ValueError, match="kind='cron' is not one of: api, cli"):
        SweepSource(kind="cron")
