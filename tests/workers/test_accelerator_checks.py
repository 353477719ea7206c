"""What is refused or checked before a trial runs on an accelerator: torch on TPU, a device that
is not the declared chip, and the address-space cap that only CPU chips take."""

from __future__ import annotations

import pydantic
import pytest

from workers.errors import DeviceMismatchError
from workers.failures import classify
from workers.options import DriverOptions
from workers.placement import ChipRequest, TrialChips
from workers.process_probe import ProcessIdentity, memory_cap_for
from workers.sweep_spec import SweepSpec
from workers.worker_group import WorkerGroup, WorkerGroupContext


def _spec(**overrides) -> SweepSpec:
    fields = dict(name="t", chips=[4], seq_lens=[256])
    fields.update(overrides)
    return SweepSpec(**fields)


def test_torch_on_tpu_is_rejected_with_the_fix():
    with pytest.raises(pydantic.ValidationError) as err:
        _spec(frameworks=["torch", "jax"], accelerator={"kind": "tpu", "type": "v5p"})
    message = str(err.value)
    assert "frameworks includes 'torch' but accelerator.kind='tpu'" in message
    assert "use frameworks: [jax] on TPU" in message
    assert _spec(frameworks=["jax"], accelerator={"kind": "tpu", "type": "v5p"})
    assert _spec(frameworks=["torch"], accelerator={"kind": "gpu", "type": "h100-pcie"})


def test_unknown_accelerator_type_lists_the_table():
    with pytest.raises(pydantic.ValidationError, match="h100-pcie"):
        _spec(frameworks=["torch"], accelerator={"kind": "gpu", "type": "h800"})


def _gpu_group(device_names: list[str]) -> WorkerGroup:
    """A GPU worker group as WorkerGroup.create leaves it, its processes' identities given
    (no GPU here: the ranks' reports are what the check reads)."""
    request = ChipRequest(framework="torch", chips=len(device_names), accelerator_kind="gpu",
                          accelerator_type="h100")
    chips = TrialChips(request=request, placement_group=None,
                       bundle_nodes=("n",) * len(device_names), chips_per_bundle=1)
    ctx = WorkerGroupContext(chips=chips, options=DriverOptions())
    identities = tuple(ProcessIdentity(device_name=name, affinity=(0,)) for name in device_names)
    return WorkerGroup(ctx, [], (), {}, identities)


def test_device_mismatch_fails_the_trial_with_both_names():
    group = _gpu_group(["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB"])
    assert group.device_names == ("NVIDIA A100-SXM4-80GB",)
    with pytest.raises(DeviceMismatchError) as err:
        group.check_devices("h100")
    verdict = classify(err.value)  # what the trial runner stores
    assert verdict.status == "failed" and not verdict.retry
    assert "'h100'" in verdict.error and "'NVIDIA A100-SXM4-80GB'" in verdict.error
    _gpu_group(["NVIDIA H100 80GB HBM3"]).check_devices("h100")  # h100 means SXM
    with pytest.raises(DeviceMismatchError, match="declare accelerator.type 'h100-pcie'"):
        _gpu_group(["NVIDIA H100 PCIe"]).check_devices("h100-sxm")


def test_error_pickles():
    import pickle

    err = DeviceMismatchError("declared 'h100' but 'NVIDIA A100'")
    assert str(pickle.loads(pickle.dumps(err))) == str(err)


@pytest.mark.parametrize("kind, limit, applied", [
    ("cpu", 1 << 30, 1 << 30), ("cpu", None, None), ("gpu", 1 << 30, None),
    ("tpu", 1 << 30, None)])
def test_address_space_cap_only_on_cpu_chips(kind, limit, applied):
    assert memory_cap_for(kind, limit) == applied
