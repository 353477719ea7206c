"""The capacity planner on dp × cp meshes (issue 24 items 3-4): plan trials of a mesh as its
evidence, link fits over measured trials of every mesh, and `--validate` holding out the
largest chip count of a dp × cp sweep."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from service.db.models import Result
from service.main import create_app

from .conftest import api_settings
from .seed import seed_sweep

QUERY = {"preset": "tiny", "seq_len": 512, "accelerator": "cpu", "num_layers": 1,
         "dtype": "float32", "max_chips": 4, "modes": "p2p", "param_shardings": "replicated",
         "remats": "none"}


@pytest.mark.timeout(60)
def test_a_dp_mesh_with_a_plan_trial_rests_on_the_plans_estimate(session_factory, db_url):
    """Measured trials on dp 1 only, plans of dp 1 and dp 2 meshes: a dp 2 × cp 2 candidate
    takes its memory from its own plan (`estimated`, as any plan's) and its bytes from the
    plan's HLO; a mesh without a plan (dp 4) stays derived from its replica."""
    seed_sweep(session_factory, name="measured", frameworks=["jax"], modes=["p2p"],
               chips=[1, 2, 4], seq_lens=[256, 512])
    seed_sweep(session_factory, name="plans", kinds=["plan"], frameworks=["jax"],
               modes=["p2p"], chips=[2, 4], dp=[1, 2], seq_lens=[512])
    with session_factory() as session:
        (plan,) = session.scalars(select(Result).where(
            Result.kind == "plan", Result.chips == 4, Result.dp == 2, Result.seq_len == 512))
        plan_id, estimate = plan.trial_id, plan.estimated_memory_bytes_per_chip
    with TestClient(create_app(api_settings(db_url))) as client:
        answer = client.get("/api/capacity", params=QUERY).json()
    by_mesh = {(c["chips"], c["dp"]): c for c in answer["candidates"]}

    mesh = by_mesh[4, 2]
    memory, comm, step = (mesh[f] for f in ("memory_bytes_per_chip",
                                             "comm_bytes_per_step_per_chip", "step_time_s"))
    assert (memory["basis"], memory["value"], memory["trial_ids"]) == (
        "estimated", estimate, [plan_id])
    assert memory["note"] == "xla_memory_analysis"
    assert by_mesh[4, 1]["memory_bytes_per_chip"]["basis"] == "estimated"  # labelled alike
    assert (comm["basis"], comm["value"], comm["trial_ids"]) == ("measured", 4 * 6 + 4 * 4,
                                                                 [plan_id])
    assert "dp=2 × cp=2 mesh (plan trial" in comm["note"]
    assert step["basis"] == "extrapolated" and plan_id in step["trial_ids"]  # nothing ran it

    pure = by_mesh[4, 4]  # no plan of dp 4: the replica's figures moved by what dp changes
    assert pure["memory_bytes_per_chip"]["basis"] == "extrapolated"
    assert "dp=4" in pure["memory_bytes_per_chip"]["note"]
