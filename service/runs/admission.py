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
        "msg": (f"the grid has {s.grid_size} trials ({_breakdown(s)}); at most {grid_cap} "
                "are accepted (GDN_SWEEP_GRID_CAP): split the sweep or drop values"),
        "ctx": {"grid_size": s.grid_size, "grid_cap": grid_cap}}


def _breakdown(s: SweepSpec) -> str:
    """How the grid size comes about, per kind of trial."""
    parts = []
    for kind in s.kinds:
        repeats = s.repeats if kind == "measure" else 1
        parts.append(
            f"{kind}: repeats {repeats} × frameworks {len(s.frameworks_of(kind))} × seq_lens "
            f"{len(s.seq_lens)} × dtypes {len(s.dtypes)} × param_shardings "
            f"{len(s.param_shardings)} × remats {len(s.remats)} × (modes {len(s.modes)} × chip "
            f"counts {len(s.chips) - s.has_baseline}"
            f"{' + the one-chip baseline' if s.has_baseline else ''})")
    return "; ".join(parts)


def validation_text(err) -> str:
    """A pydantic ValidationError as `field: message` lines."""
    return "\n".join(f"{'.'.join(str(p) for p in e['loc']) or 'input'}: {e['msg']}"
                     for e in err.errors())
