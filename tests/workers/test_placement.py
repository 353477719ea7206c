"""Placement groups of a trial: bundles per chip, timeouts that clean up, TPU slice shapes."""

from __future__ import annotations

import pytest
import ray

from workers.errors import PlacementTimeoutError
from workers.placement import ChipRequest, TrialChips, chip_resource, tpu_topology


@pytest.mark.timeout(30)
@pytest.mark.parametrize("accel, chips, topology", [
    ("v5p", 4, "2x2x1"), ("v5p", 8, "2x2x2"), ("v5p", 16, "2x2x4"), ("v4", 32, "2x4x4"),
    ("v5p", 64, "4x4x4"), ("v6e", 1, "1x1"), ("v6e", 4, "2x2"), ("v5e", 8, "2x4"),
    ("v6e", 16, "4x4"), ("v6e", 32, "4x8")], ids=lambda v: str(v))
def test_tpu_topology(accel, chips, topology):
    assert tpu_topology(accel, chips) == topology


@pytest.mark.timeout(30)
def test_requests_name_their_resource():
    with pytest.raises(ValueError, match="not a standard v5p slice size"):
        tpu_topology("v5p", 6)
    assert [chip_resource(k) for k in ("cpu", "gpu", "tpu")] == ["cpu_chip", "GPU", "TPU"]
    with pytest.raises(ValueError, match="accelerator_kind='npu'"):
        ChipRequest(framework="torch", chips=2, accelerator_kind="npu", accelerator_type="x")


@pytest.mark.timeout(120)
def test_bundles_per_chip_and_removal(local_ray):
    request = ChipRequest(framework="torch", chips=3, accelerator_kind="cpu",
                          accelerator_type="cpu")
    chips = TrialChips.create(request, timeout_s=60)
    try:
        assert len(chips.bundle_nodes) == 3 and chips.chips_per_bundle == 1
        assert chips.process_slots(per_host=False) == ((0,), (1,), (2,))
        assert chips.process_slots(per_host=True) == ((0, 1, 2),)
        table = ray.util.placement_group_table(chips.placement_group)
        assert table["bundles"] == {i: {"cpu_chip": 1.0} for i in range(3)}
    finally:
        chips.remove()
    assert ray.util.placement_group_table(chips.placement_group)["state"] == "REMOVED"


@pytest.mark.timeout(120)
def test_placement_timeout_removes_the_group(local_ray):
    request = ChipRequest(framework="torch", chips=64, accelerator_kind="cpu",
                          accelerator_type="cpu")
    before = set(ray.util.placement_group_table())
    with pytest.raises(PlacementTimeoutError, match="placement_timeout_s") as info:
        TrialChips.create(request, timeout_s=1.0)
    assert info.value.bundles == 64 and info.value.total == 8
    new = {k: v for k, v in ray.util.placement_group_table().items() if k not in before}
    assert new and all(g["state"] == "REMOVED" for g in new.values())


@pytest.mark.timeout(120)
def test_cancel_while_waiting_for_chips_removes_the_group(local_ray):
    import time

    from workers.errors import PlacementCancelledError

    request = ChipRequest(framework="torch", chips=64, accelerator_kind="cpu",
                          accelerator_type="cpu")
    give_up = time.monotonic() + 1.0
    before = set(ray.util.placement_group_table())
    with pytest.raises(PlacementCancelledError):
        TrialChips.create(request, timeout_s=60, cancelled=lambda: time.monotonic() > give_up)
    assert time.monotonic() - give_up < 10
    new = {k: v for k, v in ray.util.placement_group_table().items() if k not in before}
    assert new and all(g["state"] == "REMOVED" for g in new.values())
