"""What every way in (POST /api/sweeps and /api/schedules, `gdn-sweep run`, `--jsonl`) refuses
beyond SweepSpec's own validation, with one message each: the grid cap, and a model the presets
cannot build."""

from __future__ import annotations

from workers.grid import expand_trials
from workers.sweep_spec import SweepSpec


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


def spec_errors(spec: SweepSpec, grid_cap: int) -> list[dict]:
    """What POST /api/sweeps would refuse beyond the schema (the grid cap, a model the presets
    cannot build), as 422 items located at the `spec` of a body that holds one (a schedule's);
    empty if the spec can make a sweep."""
    too_large = grid_cap_error(spec, grid_cap)
    if too_large is not None:
        return [{**too_large, "loc": ["body", "spec"]}]
    try:
        expand_trials(spec)
    except ValueError as err:
        return [{"type": "value_error", "loc": ["body", "spec", "model"], "msg": str(err)}]
    return []


def _breakdown(s: SweepSpec) -> str:
    """How the grid size comes about, per kind of trial."""
    parts = []
    once = [(chips, dp) for chips, dp in s.meshes if s.runs_once(chips, dp)]
    pure_dp = sum(dp > 1 for _, dp in once)
    per_mode = (f"chip counts {len(s.meshes) - len(once)}" if s.dp == [1]
                else f"meshes (chips × dp) {len(s.meshes) - len(once)}")
    run_once = ((" + the one-chip baseline" if (1, 1) in once else "")
                + (f" + {pure_dp} pure data-parallel mesh(es)" if pure_dp else ""))
    for kind in s.kinds:
        repeats = s.repeats if kind == "measure" else 1
        per_layers = " + ".join(
            f"{layers}: modes {len(s.modes)}"
            + (f" × attn_cps {len(s.attn_cps_of(layers))}" if layers == "hybrid" else "")
            + f" × layouts {len(s.layouts)} × {per_mode}{run_once}"
            for layers in s.layers)
        parts.append(
            f"{kind}: repeats {repeats} × frameworks {len(s.frameworks_of(kind))} × kernels "
            f"{len(s.kernels_of(kind))} × seq_lens "
            f"{len(s.seq_lens)} × dtypes {len(s.dtypes)} × param_shardings "
            f"{len(s.param_shardings)} × remats {len(s.remats)} × documents "
            f"{len(s.documents)} × ({per_layers})")
    return "; ".join(parts)


def validation_text(err) -> str:
    """A pydantic ValidationError as `field: message (got value)` lines; the value cut to 60
    characters, left out where pydantic has none (a missing field)."""
    def line(e) -> str:
        where = ".".join(str(p) for p in e["loc"]) or "input"
        got = "" if e["type"] == "missing" or "input" not in e else \
            f" (got {_short(repr(e['input']))})"
        return f"{where}: {e['msg']}{got}"

    return "\n".join(line(e) for e in err.errors())


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"
