"""What every way in (POST /api/sweeps and /api/schedules, `gdn-sweep run`, `--jsonl`) refuses
beyond SweepSpec's own validation, with one message each: the grid cap, a model the presets
cannot build, and a trial key longer than its column. All are answered from the spec, without
expanding its trials (the expansion predicts every point's memory: it is done once, where its
trials are used)."""

from __future__ import annotations

from collections.abc import Sequence

from gdn_core.presets import get_preset
from workers.grid import MAX_KEY_CHARS, trial_key
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
    cannot build, a key too long), as 422 items located at the `spec` of a body that holds one
    (a schedule's); empty if the spec can make a sweep."""
    too_large = grid_cap_error(spec, grid_cap)
    if too_large is not None:
        return [{**too_large, "loc": ["body", "spec"]}]
    problem = model_problem(spec)
    if problem is not None:
        return [{"type": "value_error", "loc": ["body", "spec", "model"], "msg": problem}]
    problem = key_problem(spec)
    if problem is not None:
        return [{"type": "value_error", "loc": ["body", "spec", "documents"], "msg": problem}]
    return []


def model_problem(spec: SweepSpec) -> str | None:
    """Why the presets cannot build the sweep's model for one of its decoders (`layers`): the
    ValueError expand_trials would raise; None when they can."""
    for layers in spec.layers:
        try:
            get_preset(spec.model.preset, num_layers=spec.model.num_layers,
                       vocab_size=spec.model.vocab_size, layers=layers)
        except ValueError as err:
            return str(err)
    return None


def key_problem(spec: SweepSpec) -> str | None:
    """Why a trial of the sweep could not be stored: its longest key is over the key column's
    MAX_KEY_CHARS (workers.grid.TrialSpec refuses such a point); None when every key fits."""
    key = longest_trial_key(spec)
    if len(key) <= MAX_KEY_CHARS:
        return None
    return (f"the trial key {key!r} has {len(key)} characters, over the {MAX_KEY_CHARS} a "
            f"stored key holds; use a shorter documents value or fewer non-default settings")


def longest_trial_key(spec: SweepSpec) -> str:
    """The longest key of the sweep's trials (grid.trial_key), found dimension by dimension
    (a key joins one part per dimension) instead of over the whole grid. As expand_trials
    makes them: a mesh that runs once (SweepSpec.runs_once) is mode "none" with no attn_cp,
    contiguous; plans have no repeat."""
    keys = []
    for kind in spec.kinds:
        repeat = spec.repeats - 1 if spec.repeats > 1 and kind == "measure" else None
        settings = dict(framework=spec.frameworks_of(kind), kernels=spec.kernels_of(kind),
                        seq_len=spec.seq_lens, dtype=spec.dtypes,
                        param_sharding=spec.param_shardings, remat=spec.remats,
                        documents=spec.documents)
        for layers in spec.layers:
            cp_meshes = [m for m in spec.meshes if m not in spec.once_meshes]
            shapes = [(dict(mode=spec.modes, attn_cp=spec.attn_cps_of(layers),
                            layout=spec.layouts), cp_meshes),
                      (dict(mode=["none"], attn_cp=[None], layout=["contiguous"]),
                       spec.once_meshes)]
            keys += [_longest(dict(kind=kind, layers=layers, repeat=repeat),
                              {**settings, **cp}, meshes)
                     for cp, meshes in shapes if meshes]
    return max(keys, key=len)


def _longest(fixed: dict, choices: dict[str, Sequence], meshes: Sequence[tuple[int, int]]) -> str:
    """The longest trial_key with `fixed` and one value of each of `choices` and `meshes`:
    the parts are independent, so each dimension's longest part is picked on its own."""
    chips, dp = meshes[0]
    pick = {name: values[0] for name, values in choices.items()}

    def key(**change) -> str:
        return trial_key(**{**fixed, **pick, "chips": chips, "dp": dp, **change})

    for name, values in choices.items():
        pick[name] = max(values, key=lambda v: len(key(**{name: v})))
    chips, dp = max(meshes, key=lambda m: len(key(chips=m[0], dp=m[1])))
    return key()


def _breakdown(s: SweepSpec) -> str:
    """How the grid size comes about, per kind of trial: SweepSpec.grid_size_of's factors."""
    once = s.once_meshes
    pure_dp = sum(dp > 1 for _, dp in once)
    run_once = ((" + the one-chip baseline" if (1, 1) in once else "")
                + (f" + {pure_dp} pure data-parallel mesh(es)" if pure_dp else ""))
    cp_meshes = "chip counts" if s.dp == [1] else "meshes (chips × dp)"

    def product(factors: dict[str, int]) -> str:
        return " × ".join(f"{cp_meshes if name == 'cp_meshes' else name} {n}"
                          for name, n in factors.items())

    parts = []
    for kind in s.kinds:
        per_layers = " + ".join(f"{layers}: {product(s.cp_factors(layers))}{run_once}"
                                for layers in s.layers)
        parts.append(f"{kind}: {product(s.grid_factors(kind))} × ({per_layers})")
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
