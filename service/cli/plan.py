"""`gdn-sweep plan`: the capacity planner in a terminal, and `--validate SWEEP_ID`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from gdn_core.config import LAYERS
from gdn_core.cp_layout import LAYOUTS
from gdn_core.cp_modes import ATTN_CP_MODES, CP_MODES
from gdn_core.datasheets import GIB
from gdn_core.train_config import COMPUTE_DTYPES, FRAMEWORKS, PARAM_SHARDINGS, REMATS

BASIS_MARK = {"measured": "m", "estimated": "e", "interpolated": "i", "extrapolated": "x",
              "predicted": "p", "roofline": "r", "refused": "-"}
LEGEND = ("m measured (a trial of this point), e a plan's XLA estimate, i interpolated, "
          "x extrapolated, p analytic prediction, r roofline at a stated efficiency, "
          "- refused (why: below)")


def add_plan_parser(sub, db_help: str) -> None:
    p = sub.add_parser("plan", help="which chips, how many, which CP mode for a model at a "
                       "sequence length (from the results database); or --validate a sweep")
    p.add_argument("--db", dest="database_url", help=db_help)
    p.add_argument("--preset", help="model preset (gdn_core.presets); or the shape below")
    shape = p.add_argument_group("GDN shape (instead of a preset, or changing one)")
    for field in ("hidden_size", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim",
                  "num_layers", "intermediate_size", "vocab_size"):
        shape.add_argument("--" + field.replace("_", "-"), dest=field, type=int)
    p.add_argument("--seq-len", type=int, help="target tokens per sequence")
    p.add_argument("--accelerator", help="chip type: h100, v5p, … or cpu")
    p.add_argument("--chip-memory-gib", type=float, help="memory per chip (default: the chip's)")
    p.add_argument("--max-chips", type=int, default=1024, help="chip budget (default 1024)")
    p.add_argument("--dp", action="append", type=int,
                   help="data-parallel replicas to plan, repeatable (default: every power of two "
                        "dividing a chip count; each mesh is dp × chips/dp CP chips)")
    p.add_argument("--batch", type=int, default=1, help="sequences per replica (default 1)")
    p.add_argument("--dtype", choices=COMPUTE_DTYPES, default="bfloat16")
    p.add_argument("--framework", action="append", choices=FRAMEWORKS)
    p.add_argument("--mode", action="append", choices=CP_MODES)
    p.add_argument("--layers", action="append", choices=LAYERS,
                   help="decoder, repeatable (default: the preset's own — hybrid for the "
                        "published presets)")
    p.add_argument("--attn-cp", action="append", choices=ATTN_CP_MODES,
                   help="the hybrid's attention CP mode, repeatable (default: the undominated "
                        "ones)")
    p.add_argument("--layout", action="append", choices=LAYOUTS,
                   help="sequence layout, repeatable (default: zigzag for ring attention, "
                        "contiguous otherwise)")
    p.add_argument("--param-sharding", action="append", choices=PARAM_SHARDINGS)
    p.add_argument("--remat", action="append", choices=REMATS)
    p.add_argument("--kernels", choices=("reference", "fused"), default=None,
                   help="plan for this implementation (default reference; JAX's fused GDN "
                        "is the Pallas chunk rule, its step times unmeasured until a trial)")
    p.add_argument("--sweep-id", action="append", type=int, help="evidence only from these")
    p.add_argument("--rows", type=int, default=12, help="candidates printed (default 12)")
    p.add_argument("--json", action="store_true", help="the whole answer as JSON")
    p.add_argument("--validate", type=int, metavar="SWEEP_ID",
                   help="hold out levels of this sweep, predict them from the rest, print errors")
    p.add_argument("--fit", action="store_true",
                   help="instead: bisect compile-only plans (JAX, virtual CPU chips, here) for "
                        "the longest seq_len ≤ --seq-len that fits a chip, for each --chips, "
                        "--dp, --mode, --param-sharding and --remat; every compile is stored "
                        "as a plan trial of one sweep in --db")
    p.add_argument("--chips", action="append", type=int, help="chip counts for --fit (all "
                   "chips of a mesh; --dp splits them into dp replicas, default 1)")
    p.add_argument("--no-record", action="store_true", help="--fit: do not store its compiles "
                   "as plan trials in the database (they are, by default)")
    p.set_defaults(run=run_plan, parser=p)


def run_plan(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    from pydantic import ValidationError

    from service.cli.database import (MissingDatabase, database_command, database_session,
                                      database_to_read)
    from service.planner.capacity import plan_capacity
    from service.planner.evidence import evidence_for
    from service.schemas.planner import SHAPE_FIELDS, CapacityRequest
    from service.runs.admission import validation_text

    if args.validate is None and not (args.seq_len and args.accelerator):
        args.parser.error("give --seq-len, --accelerator and --preset or the shape (or "
                          "--validate SWEEP_ID)")
    if args.fit:
        return run_fit(args, out)
    if args.validate is not None:
        def validate_sweep() -> int:
            url = database_to_read(args.database_url, err=sys.stderr)
            with database_session(url) as session:
                return _validate(session, args.validate, out)

        return database_command(validate_sweep, err=sys.stderr)
    try:
        url = database_to_read(args.database_url, err=sys.stderr)
    except MissingDatabase as missing:
        print(f"{missing}: planning from the datasheets and published runs alone",
              file=sys.stderr)
        url = None
    given = {**{f: getattr(args, f) for f in SHAPE_FIELDS},
             "frameworks": args.framework, "modes": args.mode, "dp": args.dp,
             "layers": args.layers, "attn_cps": args.attn_cp, "layouts": args.layout,
             "param_shardings": args.param_sharding, "remats": args.remat,
             "kernels": args.kernels, "sweep_id": args.sweep_id,
             "chip_memory_bytes": (int(args.chip_memory_gib * GIB)
                                   if args.chip_memory_gib else None)}
    try:
        request = CapacityRequest(
            preset=args.preset, seq_len=args.seq_len, accelerator=args.accelerator,
            max_chips=args.max_chips, batch_size=args.batch, dtype=args.dtype,
            **{k: v for k, v in given.items() if v})
    except ValidationError as err:
        print(validation_text(err), file=sys.stderr)
        return 2

    def answer_plan() -> int:
        evidence = []
        if url is not None:
            with database_session(url) as session:
                evidence = evidence_for(session, request)
        answer = plan_capacity(evidence, request)
        if args.json:
            out.write(answer.model_dump_json(indent=1) + "\n")
        else:
            out.write(format_answer(answer, rows=args.rows))
        return 0

    return database_command(answer_plan, err=sys.stderr)


def _fig(figure, scale: float = 1.0, fmt: str = "{:,.0f}") -> str:
    if figure.value is None:
        return f"{'n/a':>9} {BASIS_MARK[figure.basis]}"
    return f"{fmt.format(figure.value / scale):>9} {BASIS_MARK[figure.basis]}"


def _mesh(c) -> str:
    return f"{c.dp}×{c.cp_chips}"


def _split(c) -> str:
    """The GDN mode, and the hybrid's attention CP mode and layout where they apply."""
    if c.cp_chips == 1:
        return "none"
    attention = f"/{c.attn_cp}" if c.attn_cp else ""
    return f"{c.mode}{attention}" + ("/zigzag" if c.layout == "zigzag" else "")


def describe(c) -> str:
    """A candidate in words: "1 chip (no CP)", "8 chips, data parallel (dp 8, no CP)",
    "p2p/ring/zigzag on 64 chips (dp×cp 1×64)"."""
    if c.chips == 1:
        where = "1 chip (no CP)"
    elif c.cp_chips == 1:
        where = f"{c.chips} chips, data parallel (dp {c.dp}, no CP)"
    else:
        where = f"{_split(c)} on {c.chips} chips (dp×cp {_mesh(c)})"
    return f"{c.layers} {where}, {c.param_sharding}, remat {c.remat}"


def _row(c) -> str:
    return (f"{c.framework:<5} {c.layers[:6]:<6} {_split(c):<28} {c.chips:>5} {_mesh(c):>8} "
            f"{c.param_sharding:<10} {c.remat:<4} "
            f"{_fig(c.memory_bytes_per_chip, GIB, '{:,.1f}')} {_fig(c.tokens_per_s_per_chip)} "
            f"{_fig(c.chip_hours_per_billion_tokens, 1, '{:,.4g}')} {_fig(c.tokens_per_s)} "
            f"{_fig(c.mfu, 0.01, '{:.1f}')} "
            f"{_fig(c.comm_bytes_per_step_per_chip, 2 ** 20, '{:,.1f}')}")


HEADER = (f"{'fw':<5} {'layers':<6} {'mode/attn_cp/layout':<28} {'chips':>5} {'dp×cp':>8} "
          f"{'params':<10} {'rmat':<4} {'GiB/chip':>11} {'tok/s/chip':>11} {'chip-h/1B tok':>11} "
          f"{'tok/s':>11} {'MFU %':>11} {'comm MiB':>11}")


def _pick_line(title: str, pick, answer, why_none: str) -> str:
    if pick is None:
        return f"{title}: none — {why_none}"
    speed = pick.tokens_per_s_per_chip
    if speed.value is None:
        return f"{title}: {describe(pick)} (speed unknown: {speed.note})"
    hours = pick.chip_hours_per_billion_tokens.value
    return (f"{title}: {describe(pick)}: {speed.value:,.0f} tokens/s/chip, {hours:,.4g} "
            f"chip-hours per 10⁹ tokens, {pick.tokens_per_s.value:,.0f} tokens/s in all "
            f"({_basis_words(speed, answer)})")


def _basis_words(figure, answer) -> str:
    if figure.basis == "roofline" and answer.speed_basis is not None:
        return f"roofline at {answer.speed_basis.label}"
    ids = figure.trial_ids
    return f"{figure.basis}, trials {ids[:6]}" + (" …" if len(ids) > 6 else "")


def _why_no_speed(answer) -> str:
    """Why no fitting candidate has a step time: the refusals' reasons, most common first."""
    fitting = [c for c in answer.candidates if c.fits]
    if not fitting:
        return _why_nothing_fits(answer)
    notes: dict[str, int] = {}
    for c in fitting:
        if c.step_time_s.value is None:
            notes[c.step_time_s.note] = notes.get(c.step_time_s.note, 0) + 1
    if not notes:
        return "no candidate that fits has a speed"
    note, count = max(notes.items(), key=lambda kv: kv[1])
    return f"no candidate that fits has a step time ({count} of {len(fitting)}: {note})"


def _why_nothing_fits(answer) -> str:
    sized = [c for c in answer.candidates if c.memory_bytes_per_chip.value is not None]
    if not sized:
        return "no candidate has a memory figure"
    least = min(sized, key=lambda c: c.memory_bytes_per_chip.value)
    return (f"nothing fits {answer.chip_memory_bytes / GIB:,.1f} GiB per chip within "
            f"{answer.request.max_chips} chips; the least is {describe(least)} at "
            f"{least.memory_bytes_per_chip.value / GIB:,.1f} GiB per chip")


def format_answer(answer, *, rows: int) -> str:
    r = answer.request
    lines = [f"{r.preset or 'custom shape'} ({', '.join(r.planned_layers())}) at seq_len "
             f"{r.seq_len:,} × batch {r.batch_size} per replica on {r.accelerator}, {r.dtype}, "
             f"{r.kernels} kernels "
             f"({answer.chip_memory_bytes / GIB:,.1f} GiB per chip: {answer.chip_memory_source});"
             f" {answer.evidence_trials} trial(s) of evidence", LEGEND]
    if answer.speed_basis is not None:
        lines.append(f"r (roofline) figures assume {answer.speed_basis.label}: "
                     f"{answer.speed_basis.source}")
    lines.append("")
    no_speed = _why_no_speed(answer)
    for title, pick, why in (("fewest chips that fit", answer.fewest_chips,
                              _why_nothing_fits(answer)),
                             ("fewest chip-hours per token", answer.cheapest, no_speed),
                             (f"fastest within {r.max_chips} chips", answer.fastest, no_speed)):
        lines.append(_pick_line(title, pick, answer, why))
    if answer.plan_checks:
        lines += ["", "plans beside measured trials of the same point (XLA:CPU estimate ÷ "
                  "measured peak):"]
        lines += [f"  {c.point}: {c.plan_estimate_bytes / GIB:,.3f} GiB vs "
                  f"{c.measured_peak_bytes / GIB:,.3f} GiB ({c.measured_source}) = "
                  f"{c.ratio:.2f}×" for c in answer.plan_checks[:rows]]
    fitting = [c for c in answer.candidates if c.fits]
    shown = fitting[:rows]
    lines += ["", f"{len(fitting)} of {len(answer.candidates)} candidates fit; the first "
              f"{len(shown)}:", HEADER, *(_row(c) for c in shown)]
    refused = {c.step_time_s.note for c in shown if c.step_time_s.basis == "refused"}
    lines += [f"  - refused: {note}" for note in sorted(refused)[:3]]
    lines += [""] + [f"note: {c}" for c in answer.caveats]
    return "\n".join(lines) + "\n"


def _validate(session, sweep_id: int, out: TextIO) -> int:
    from service.db.models import Sweep
    from service.planner.evidence import (
        canonical_chip,
        interpreted_note,
        load_observations,
        split_speed,
    )
    from service.planner.validate import (
        MEMORY_GOAL,
        STEP_TIME_GOAL,
        STEP_TIME_MEDIAN_GOAL,
        summary,
        validate,
    )

    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        print(f"no sweep {sweep_id} in the database", file=sys.stderr)
        return 2
    spec = sweep.spec
    preset = spec.get("model", {}).get("preset", "tiny")
    accelerator = canonical_chip(spec.get("accelerator", {}).get("type", "cpu"))
    observations, interpreted = split_speed(load_observations(
        session, preset=preset, accelerator_type=accelerator, sweep_ids=[sweep_id]))
    rows = validate(observations)
    left_out = f" ({interpreted_note(interpreted, 'left out')})" if interpreted else ""
    if not rows:
        print(f"sweep {sweep_id} has no level to hold out (it needs two chip counts or two "
              f"seq_lens of succeeded trials){left_out}", file=sys.stderr)
        return 2
    out.write(f"sweep {sweep_id} ({preset} on {accelerator}): {len(observations)} succeeded "
              f"trial(s){left_out}, {len(rows)} held-out figure(s); goals: memory ≤ "
              f"{100 * MEMORY_GOAL:.0f}% every point, step time median ≤ "
              f"{100 * STEP_TIME_MEDIAN_GOAL:.0f}%, worst ≤ {100 * STEP_TIME_GOAL:.0f}%\n")
    out.write(f"{'held out':<22} {'trial':>5} {'point':<48} {'figure':<22} {'predicted':>11} "
              f"{'observed':>11} {'error':>8}  basis\n")
    for r in rows:
        error = "n/a" if r.error is None else f"{100 * r.error:.1f}%"
        predicted = "n/a" if r.predicted is None else f"{r.predicted:,.4g}"
        out.write(f"{r.holdout:<22} {r.trial_id:>5} {r.point:<48} {r.figure:<22} "
                  f"{predicted:>11} {r.observed:>11,.4g} {error:>8}  {r.basis}"
                  f"{'  OVER GOAL' if r.over_goal else ''}\n")
    out.write("\nsummary (memory: error on the part above the fitted constant):\n")
    for s in summary(rows):
        median = "n/a" if s["median_error"] is None else f"{100 * s['median_error']:.1f}%"
        worst = "n/a" if s["max_error"] is None else f"{100 * s['max_error']:.1f}%"
        verdict = "-" if s["median_meets_goal"] is None else (
            f"median {'meets' if s['median_meets_goal'] else 'misses'}, worst "
            f"{'meets' if s['every_point_meets_goal'] else 'misses'}; {s['within_goal']}/"
            f"{s['trials']} points within {100 * s['goal']:.0f}%")
        out.write(f"  {s['figure']:<22} {s['basis']:<13} {s['trials']:>3} point(s)  median "
                  f"{median:>7} (goal {100 * s['median_goal']:.0f}%)  worst {worst:>7} "
                  f"(goal {100 * s['goal']:.0f}%)  {verdict}\n")
    _roofline_section(observations, out)
    out.write(json.dumps({"summary": summary(rows)}) + "\n")
    return 0


def _roofline_section(observations, out: TextIO) -> None:
    """How far the roofline estimate was from each measured trial (roofline_check.py)."""
    import statistics

    from service.planner.roofline_check import roofline_checks

    checks = roofline_checks(observations)
    if not checks:
        return
    out.write(f"\nroofline estimate against each measured trial ({checks[0].efficiency}; the "
              "roof: the fastest the step could be):\n")
    out.write(f"{'trial':>5} {'point':<48} {'measured s':>11} {'estimate s':>11} {'error':>8} "
              f"{'roof s':>11} {'roof/measured':>13}\n")
    for c in checks:
        out.write(f"{c.trial_id:>5} {c.point:<48} {c.measured_s:>11.4g} {c.estimate_s:>11.4g} "
                  f"{100 * c.error:>7.1f}% {c.roof_s:>11.4g} {c.share_of_roof:>13.3g}\n")
    errors = [c.error for c in checks]
    out.write(f"  roofline estimate: median error {100 * statistics.median(errors):.1f}%, worst "
              f"{100 * max(errors):.1f}% over {len(checks)} trial(s)\n")


def run_fit(args: argparse.Namespace, out: TextIO) -> int:
    """`--fit`: for each point, the longest sequence whose XLA estimate fits the chip, each
    search in a fresh process (`python -m gdn_core.jax_gdn.plan --budget-bytes`); then every
    compile made is stored as a plan trial of one sweep in the database (fit_record.py),
    unless --no-record."""
    import itertools

    from gdn_core.presets import PRESETS
    from service.runs.fit_record import FitRow, accelerator_spec
    from workers.plan_runner import plan_in_fresh_process

    if args.preset not in PRESETS:
        print(f"preset={args.preset!r} is not one of: {', '.join(PRESETS)}", file=sys.stderr)
        return 2
    try:
        chip = accelerator_spec(args.accelerator)
    except ValueError as err:
        print(f"--accelerator: {err}; or cpu", file=sys.stderr)
        return 2
    budget = _fit_budget(args, chip.type)
    if budget is None:
        return 2
    url, failed = _fit_database(args)
    if failed:
        return failed
    out.write(f"{args.preset}: the longest seq_len ≤ {args.seq_len:,} whose XLA:CPU estimate "
              f"fits {budget / GIB:,.2f} GiB per chip (an estimate of a {args.accelerator} "
              "chip's memory; each row a bisection over compiles)\n")
    out.write(f"{'mode':<10} {'chips':>5} {'dp':>3} {'params':<10} {'remat':<5} "
              f"{'fits seq_len':>13} {'its GiB':>9} {'next (over)':>12} {'its GiB':>9} "
              f"{'compiles':>8}\n")
    rows = []
    for chips, dp, mode, sharding, remat in itertools.product(
            args.chips or [8], args.dp or [1], args.mode or ["p2p"],
            args.param_sharding or ["replicated"], args.remat or ["none"]):
        head = f"{mode:<10} {chips:>5} {dp:>3} {sharding:<10} {remat:<5}"
        if chips % dp:
            out.write(f"{head} skipped: dp={dp} does not divide chips={chips}\n")
            continue
        request = {"preset": args.preset, "num_layers": args.num_layers, "seq_len": args.seq_len,
                   "chips": chips, "dp": dp, "mode": mode, "batch_size": args.batch,
                   "dtype": args.dtype, "param_sharding": sharding, "remat": remat}
        try:
            search = plan_in_fresh_process(request, budget_bytes=budget,
                                           max_seq_len=args.seq_len)
        except RuntimeError as err:
            out.write(f"{head} failed: {str(err).strip().splitlines()[-1]}\n")
            continue
        rows.append(FitRow(request=request, search=search))
        fits, over = search["fits"], search["exceeds"]
        out.write(f"{head} {fits['seq_len'] if fits else 'none':>13} "
                  f"{fits['estimated_memory_bytes'] / GIB if fits else 0:>9.3f} "
                  f"{over['seq_len'] if over else '-':>12} "
                  f"{over['estimated_memory_bytes'] / GIB if over else 0:>9.3f} "
                  f"{len(search['probes']):>8}\n")
    if url is not None and rows:
        from service.cli.database import open_database
        from service.runs.fit_record import record_fit

        with open_database(url) as session_factory:
            sweep_id, stored = record_fit(session_factory, rows, accelerator=args.accelerator,
                                          max_seq_len=args.seq_len)
        out.write(f"recorded {stored} compile(s) as plan trials of sweep {sweep_id} (a later "
                  "`gdn-sweep plan` reads them as evidence: memory `estimated`)\n")
    return 0


def _fit_budget(args: argparse.Namespace, chip_type: str) -> int | None:
    """Bytes per chip the --fit search fits: --chip-memory-gib, else the chip's HBM; None
    (said on stderr) for cpu without a size."""
    from gdn_core.datasheets import hbm_bytes_per_chip

    if args.chip_memory_gib:
        return int(args.chip_memory_gib * GIB)
    if chip_type == "cpu":
        print("--fit on cpu needs --chip-memory-gib (a virtual chip has no memory of its own)",
              file=sys.stderr)
        return None
    return hbm_bytes_per_chip(chip_type)


def _fit_database(args: argparse.Namespace) -> tuple[str | None, int]:
    """(URL, 0) of the database --fit records into (migrated and reached before any compile:
    preflight.database_error, as `run` checks its database), (None, 0) with --no-record,
    (None, exit code) when it cannot be used (2: a bad URL, 1: unreachable; said on stderr)."""
    if args.no_record:
        return None, 0
    from service.core.config import Settings
    from service.runs.preflight import database_error

    url = Settings(**({"database_url": args.database_url} if args.database_url else {})
                   ).database_url
    failed = database_error(url)
    if failed is not None:
        print(f"{failed[1]} (--no-record compiles without storing)", file=sys.stderr)
        return None, failed[0]
    return url, 0
