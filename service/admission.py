"""What every way in (POST /api/sweeps, `gdn-sweep run`, `--jsonl`) refuses beyond SweepSpec's
own validation, with one message each: today the grid cap."""

from __future__ import annotations

from workers.spec import SweepSpec


def grid_cap_error(spec: SweepSpec, grid_cap: int) -> dict | None:
    """The 422 error item (pydantic's shape) when the sweep has more trials than `grid_cap`."""
    if spec.grid_size <= grid_cap:
        return None
    s = spec
    return {
        "type": "grid_too_large", "loc": ["body"],
        "msg": (f"the grid has {s.grid_size} trials (repeats {s.repeats} × frameworks "
                f"{len(s.frameworks)} × seq_lens {len(s.seq_lens)} × dtypes {len(s.dtypes)} × "
                f"param_shardings {len(s.param_shardings)} × remats {len(s.remats)} × (modes "
                f"{len(s.modes)} × chip counts {len(s.chips) - s.has_baseline}"
                f"{' + the one-chip baseline' if s.has_baseline else ''})); at most "
                f"{grid_cap} are accepted (GDN_SWEEP_GRID_CAP): split the sweep or drop values"),
        "ctx": {"grid_size": s.grid_size, "grid_cap": grid_cap}}
