"""The capacity planner's hybrid decoder and its speed on chips without trials (issue 35 items
1-2): the published MaxText run reproduced by the roofline at its own efficiency, the basis
each chip type's estimate rests on, the hybrid's memory from gdn_core's predictor, evidence
matched on layers / attn_cp / layout, and `gdn-sweep plan` printing all of it."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from gdn_core.flops.model import model_flops_per_step
from gdn_core.datasheets import peak_flops_per_chip
from gdn_core.memory.step import predict_step_memory
from gdn_core.presets import get_preset
from gdn_core.train_config import TrainConfig
from service.cli.main import main as gdn_sweep
from service.db.engine import upgrade_database
from service.db.models import Result
from service.main import create_app
from service.planner.capacity import plan_capacity
from service.planner.evidence import load_observations
from service.planner.points import Point, model_for
from service.planner.published_runs import MAXTEXT_GDN_CP
from service.planner.roofline import comm_bytes, roofline
from service.schemas.planner import CapacityRequest

from .conftest import api_settings
from .seed import seed_sweep

MILLION = 1_048_576


def _at(answer, chips: int, **fields):
    return [c for c in answer.candidates if c.chips == chips
            and all(getattr(c, k) == v for k, v in fields.items())]


@pytest.mark.timeout(120)
def test_the_published_maxtext_run_is_reproduced_at_its_own_efficiency():
    """qwen3.5-9b hybrid, 1,048,576 tokens, 64 v5p chips: 513 tokens/s/chip published; the
    roofline at MaxText's 27.6% gives the same within 5% (this project's model FLOPs give
    28.4% at 513: one convention within 3%)."""
    answer = plan_capacity([], CapacityRequest(preset="qwen3.5-9b", seq_len=MILLION,
                                               accelerator="v5p", max_chips=64, dp=[1]))
    run = MAXTEXT_GDN_CP
    on_64 = [c for c in _at(answer, 64, dp=1, layers="hybrid") if c.fits]
    assert on_64, "the 9B hybrid must fit 64 v5p chips at 1M tokens"
    for c in on_64:
        assert c.step_time_s.basis == "roofline" and c.tokens_per_s_per_chip.basis == "roofline"
        assert c.tokens_per_s_per_chip.value == pytest.approx(run.tokens_per_s_per_chip,
                                                              rel=0.05), c
        assert c.mfu.value == pytest.approx(run.mfu)  # the efficiency, by construction
        assert c.chip_hours_per_billion_tokens.value == pytest.approx(
            1e9 / (c.tokens_per_s_per_chip.value * 3600))
    hybrid = get_preset("qwen3.5-9b", layers="hybrid")
    ours = (run.tokens_per_s_per_chip * model_flops_per_step(hybrid, batch=1, seq_len=MILLION)
            .total / MILLION / peak_flops_per_chip("v5p"))
    assert ours == pytest.approx(0.284, abs=0.002)
    # the hybrid is what was planned: GDN-only has a fifth of the work, five times the speed
    gdn_only = plan_capacity([], CapacityRequest(
        preset="qwen3.5-9b", seq_len=MILLION, accelerator="v5p", max_chips=64, dp=[1],
        layers=["gdn_only"]))
    fast = max(c.tokens_per_s_per_chip.value for c in _at(gdn_only, 64, dp=1) if c.fits)
    assert fast > 4 * run.tokens_per_s_per_chip
    assert answer.cheapest is not None and answer.fastest is not None
    assert answer.fastest.chips == 64 and answer.cheapest.layers == "hybrid"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("chip", "dtype", "label", "published"), [
    ("v5p", "bfloat16", "MaxText's measured 27.6% MFU on v5p", True),
    ("h100", "bfloat16", "the default 27.6% MFU (range 13.8%–38%; no published run on "
                         "h100-sxm)", False),
    ("v6e", "bfloat16", "no published run on v6e", False),
    ("v5p", "float32", "MaxText's measured 4.6% MFU on v5p (float32)", True),
])
def test_each_chip_types_estimate_names_the_efficiency_it_rests_on(chip, dtype, label,
                                                                    published):
    answer = plan_capacity([], CapacityRequest(preset="qwen3.5-9b", seq_len=2 ** 18,
                                               accelerator=chip, dtype=dtype, max_chips=16,
                                               dp=[1], remats=["full"]))
    basis = answer.speed_basis
    assert label in basis.label and basis.published is published
    assert basis.low <= basis.mfu <= basis.high <= 1
    timed = [c for c in answer.candidates if c.step_time_s.value is not None]
    assert timed and all(c.step_time_s.basis == "roofline" for c in timed)
    for c in timed:
        assert c.step_time_s.note.startswith(f"roofline at {basis.label}")
        assert 0 < c.mfu.value <= basis.mfu + 1e-12  # the roof only ever slows it
    assert any(label in caveat for caveat in answer.caveats)


@pytest.mark.timeout(60)
def test_where_the_roof_binds_the_estimate_is_the_roof_and_mfu_falls():
    """A short sequence on 64 chips: each chip's share of the weights' HBM traffic outlasts
    its compute, so the step is the roof's and its MFU below the efficiency."""
    request = CapacityRequest(preset="qwen3.5-9b", seq_len=4096, accelerator="v5p",
                              max_chips=64, dp=[1], modes=["p2p"], attn_cps=["ring"],
                              layouts=["zigzag"], param_shardings=["fsdp"], remats=["none"])
    (c,) = _at(plan_capacity([], request), 64)
    point = Point("jax", "p2p", 64, "fsdp", "none", 1, "hybrid", "ring", "zigzag")
    roof = roofline(request, model_for(request.model(), "hybrid"), point)
    assert roof.bound in ("HBM", "links") and roof.hbm_s > roof.compute_s
    assert "the roof binds" in c.step_time_s.note
    assert c.step_time_s.value == pytest.approx(roof.seconds)
    assert c.mfu.value < 0.276


@pytest.mark.timeout(120)
def test_hybrid_candidates_cross_attn_cp_and_layout_with_gdn_cores_memory():
    request = CapacityRequest(preset="qwen3.5-9b", seq_len=2 ** 16, accelerator="h100",
                              max_chips=32, dp=[1], modes=["all_gather"],
                              param_shardings=["zero1"], remats=["gdn"],
                              layers=["gdn_only", "hybrid"],
                              attn_cps=["ring", "all_gather_kv", "ulysses"],
                              layouts=["contiguous", "zigzag"])
    answer = plan_capacity([], request)
    assert answer.variants_left_out == 0  # listed: every variant kept
    splits = {(c.chips, c.layers, c.attn_cp, c.layout) for c in answer.candidates}
    for attn_cp in ("ring", "all_gather_kv", "ulysses"):
        for layout in ("contiguous", "zigzag"):
            assert (16, "hybrid", attn_cp, layout) in splits
    # 16 query heads cannot split over 32 chips: no ulysses there, as the trials skip it
    assert not {s for s in splits if s[0] == 32 and s[2] == "ulysses"}
    assert (32, "hybrid", "ring", "zigzag") in splits
    assert {s[2] for s in splits if s[1] == "gdn_only"} == {None}
    model = get_preset("qwen3.5-9b", layers="hybrid")
    train = TrainConfig(seq_len=2 ** 16, dtype="bfloat16", param_sharding="zero1", remat="gdn")
    by_split = {}
    for c in _at(answer, 16, layers="hybrid"):
        expected = predict_step_memory(model, train, mode="all_gather", chips=16,
                                       framework="jax", attn_cp=c.attn_cp,
                                       layout=c.layout).total
        assert c.memory_bytes_per_chip.value == expected
        assert c.memory_bytes_per_chip.basis == "predicted"
        by_split[c.attn_cp, c.layout] = c
    # all_gather_kv keeps the whole sequence's K/V: more memory than ring's blocks
    assert (by_split["all_gather_kv", "zigzag"].memory_bytes_per_chip.value
            > by_split["ring", "zigzag"].memory_bytes_per_chip.value)
    # a ring over contiguous shards leaves the last chip the most causal pairs: slower roof
    assert (by_split["ring", "contiguous"].step_time_s.value
            >= by_split["ring", "zigzag"].step_time_s.value)
    gdn = _at(answer, 16, layers="gdn_only")[0]
    assert gdn.memory_bytes_per_chip.value == predict_step_memory(
        get_preset("qwen3.5-9b"), train, mode="all_gather", chips=16, framework="jax").total


@pytest.mark.timeout(60)
def test_the_default_plans_the_presets_own_decoder_and_leaves_dominated_splits_out():
    answer = plan_capacity([], CapacityRequest(preset="qwen3.5-27b", seq_len=MILLION,
                                               accelerator="v5p", max_chips=64))
    assert {c.layers for c in answer.candidates} == {"hybrid"}
    assert answer.request.planned_layers() == ["hybrid"]
    assert answer.variants_left_out > 0 and any("variant" in c for c in answer.caveats)
    # the answer stays the size of a GDN-only one: dominated splits are neither computed nor sent
    gdn_only = plan_capacity([], CapacityRequest(preset="qwen3.5-27b", seq_len=MILLION,
                                                 accelerator="v5p", max_chips=64,
                                                 layers=["gdn_only"]))
    assert len(answer.candidates) <= len(gdn_only.candidates)
    tiny = CapacityRequest(preset="tiny", seq_len=1024, accelerator="cpu")
    assert tiny.planned_layers() == ["gdn_only"]  # its sweeps' own default


@pytest.mark.timeout(60)
def test_the_comm_count_matches_torchs_attention_bytes():
    """The roofline's attention bytes are torch_gdn's own count, without torch at run time."""
    from gdn_core.torch_gdn.cp.attention import attention_comm_bytes

    model = get_preset("qwen3.5-9b", layers="hybrid")
    a = model.attention
    for attn_cp in ("ring", "all_gather_kv", "ulysses"):
        for chips in (2, 4, 16):
            point = Point("torch", "p2p", chips, "replicated", "none", 1, "hybrid", attn_cp,
                          "zigzag")
            with_attn = comm_bytes(model, point, batch=2, seq_len=8192, dtype="bfloat16",
                                   framework="torch")
            without = comm_bytes(model_for(model, "gdn_only"), point, batch=2, seq_len=8192,
                                 dtype="bfloat16", framework="torch")
            forward, backward = attention_comm_bytes(
                attn_cp, chips=chips, batch=2, local_tokens=8192 // chips,
                num_heads=a.num_heads, num_kv_heads=a.num_kv_heads, head_dim=a.head_dim,
                itemsize=2)
            gdn_layers = model.layer_pattern.count("linear_attention")
            per_gdn_layer = without.cp / model.num_layers
            attention = with_attn.cp - gdn_layers * per_gdn_layer
            attention_layers = model.layer_pattern.count("full_attention")
            assert attention == pytest.approx(attention_layers * (forward + backward)), (
                attn_cp, chips)


@pytest.mark.timeout(60)
def test_a_hybrid_trial_is_evidence_only_for_its_own_decoder_and_split(session_factory,
                                                                       db_url):
    seed_sweep(session_factory, name="hybrid ring", frameworks=["jax"], modes=["p2p"],
               chips=[1, 2], seq_lens=[256, 512], layers=["hybrid"], attn_cps=["ring"],
               model={"preset": "tiny", "num_layers": 2})
    with session_factory() as session:
        ring = set(session.scalars(select(Result.trial_id).where(Result.chips == 2)))
        observations = load_observations(session, preset="tiny", accelerator_type="cpu")
    assert {(o.layers, o.attn_cp, o.layout) for o in observations if o.chips == 2} == {
        ("hybrid", "ring", "contiguous")}
    query = {"preset": "tiny", "seq_len": 512, "accelerator": "cpu", "dtype": "float32",
             "num_layers": 2, "max_chips": 2, "modes": "p2p", "param_shardings": "replicated",
             "remats": "none"}
    with TestClient(create_app(api_settings(db_url))) as client:
        answers = {name: client.get("/api/capacity", params={**query, **extra}).json()
                   for name, extra in (
                       ("gdn_only", {}),
                       ("ring", {"layers": "hybrid", "attn_cps": "ring",
                                 "layouts": "contiguous"}),
                       ("all_gather_kv", {"layers": "hybrid", "attn_cps": "all_gather_kv",
                                          "layouts": "contiguous"}),
                       ("zigzag", {"layers": "hybrid", "attn_cps": "ring",
                                   "layouts": "zigzag"}))}
        custom = client.get("/api/capacity", params={
            "hidden_size": 64, "num_k_heads": 2, "num_v_heads": 4, "head_k_dim": 16,
            "head_v_dim": 16, "num_layers": 2, "intermediate_size": 128, "vocab_size": 256,
            "seq_len": 512, "accelerator": "cpu", "layers": "hybrid"})
        bad = client.get("/api/capacity", params={**query, "attn_cps": "striped"})

    def two(name):
        (c,) = [c for c in answers[name]["candidates"] if (c["chips"], c["dp"]) == (2, 1)]
        return c

    assert two("ring")["step_time_s"]["basis"] == "measured"
    assert set(two("ring")["step_time_s"]["trial_ids"]) <= ring
    for other in ("gdn_only", "all_gather_kv", "zigzag"):  # not evidence for these
        step = two(other)["step_time_s"]
        assert step["basis"] != "measured" and not set(step["trial_ids"]) & ring, other
    assert two("gdn_only")["layers"] == "gdn_only" and two("gdn_only")["attn_cp"] is None
    assert custom.status_code == 422 and "layers='hybrid'" in custom.text
    assert "a GDN shape given by hand" in custom.text
    assert bad.status_code == 422 and "striped" in bad.text


@pytest.mark.timeout(120)
def test_plan_prints_hybrid_candidates_with_speed_cost_and_basis(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    upgrade_database(url)
    assert gdn_sweep(["plan", "--db", url, "--preset", "qwen3.5-27b", "--seq-len", "1048576",
                      "--accelerator", "v5p", "--max-chips", "256"]) == 0
    out = capsys.readouterr().out
    print(out)  # the report quotes its first rows
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("fw "))
    assert "tok/s/chip" in lines[header] and "chip-h/1B tok" in lines[header]
    rows = lines[header + 1:header + 13]
    assert rows and all(row.split()[1] == "hybrid" for row in rows)
    for row in rows:  # tokens/s/chip and chip-hours, each marked r (roofline)
        assert re.search(r"\s[\d,]+ r\s+[\d,.]+ r\s", row), row
    assert "r (roofline) figures assume MaxText's measured 27.6% MFU on v5p" in out
    for pick in ("fewest chips that fit: hybrid", "fewest chip-hours per token: hybrid",
                 "fastest within 256 chips: hybrid"):
        line = next(line for line in lines if line.startswith(pick))
        assert "tokens/s/chip" in line and "chip-hours per 10⁹ tokens" in line
        assert "(roofline at MaxText's measured 27.6% MFU on v5p)" in line

    # CPU chips without trials: no roofline; the reason printed without --json
    assert gdn_sweep(["plan", "--db", url, "--preset", "tiny", "--seq-len", "1024",
                      "--accelerator", "cpu", "--max-chips", "4"]) == 0
    out = capsys.readouterr().out
    assert "fewest chips that fit: gdn_only 1 chip (no CP)" in out and "none ×" not in out
    assert ("fewest chip-hours per token: none — no candidate that fits has a step time"
            in out)
    assert "no one-chip measured trial of these settings on this chip type" in out


@pytest.mark.timeout(120)
def test_plan_validate_prints_the_rooflines_error_per_trial(session_factory, db_url, capsys):
    sweep = seed_sweep(session_factory, name="h100 p2p", frameworks=["jax"], modes=["p2p"],
                       chips=[1, 2], seq_lens=[256, 512],
                       accelerator={"kind": "gpu", "type": "h100"})
    assert gdn_sweep(["plan", "--db", db_url, "--validate", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "roofline estimate against each measured trial (the default 27.6% MFU" in out
    section = out[out.index("roofline estimate against"):].splitlines()
    rows = [line.split() for line in section[2:] if line.strip() and line.split()[0].isdigit()]
    with session_factory() as session:
        measured = {r.trial_id: r.step_time_s for r in session.scalars(select(Result))}
    assert {int(r[0]) for r in rows} == set(measured)
    for trial_id, _point, observed, estimate, error, *_ in rows:
        assert float(observed) == pytest.approx(measured[int(trial_id)], rel=1e-3)
        assert float(error.rstrip("%")) == pytest.approx(
            100 * abs(float(estimate) - float(observed)) / float(observed), abs=0.2)
    assert re.search(r"roofline estimate: median error [\d.]+%, worst [\d.]+% over 4 trial",
                     out)
    assert out.strip().splitlines()[-1].startswith('{"summary"')  # the JSON stays last


def test_every_chip_has_a_datasheet_bandwidth_in_bytes_per_second():
    """The roofline's HBM roof: each chip's bf16 peak ÷ its bandwidth lands where datasheet
    ridge points do (~150–600 FLOPs per byte), which a GB-for-Gb or TB-for-GB slip would not;
    aliases read the same part."""
    from gdn_core.datasheets import CHIP_SPECS, hbm_bandwidth_per_chip

    for name, spec in CHIP_SPECS.items():
        assert 100 <= spec.bf16_dense_flops / spec.hbm_bytes_per_s <= 600, name
        assert hbm_bandwidth_per_chip(name) == spec.hbm_bytes_per_s
    assert hbm_bandwidth_per_chip("H100") == hbm_bandwidth_per_chip("h100-sxm")
    assert hbm_bandwidth_per_chip("tpu-v5p") > hbm_bandwidth_per_chip("v5e")


@pytest.mark.timeout(60)
def test_a_measured_peak_without_its_source_still_answers(session_factory, client):
    """A result with a peak and no memory_source (older rows, hand-written ones) is a measured
    figure with an empty note, not a 500."""
    from .regression_nights import nightly_levels, nightly_schedule, run_nights

    nightly_schedule(session_factory)
    run_nights(session_factory, {"shifted": nightly_levels(81, 2), "steady": nightly_levels(82, 2)})
    answer = client.get("/api/capacity", params={"preset": "tiny", "num_layers": 1,
                                                 "seq_len": 64, "accelerator": "cpu",
                                                 "max_chips": 1, "frameworks": "torch",
                                                 "dtype": "float32", "layers": "gdn_only"})
    assert answer.status_code == 200, answer.text
    (one_chip, *_) = [c for c in answer.json()["candidates"] if c["chips"] == 1]
    assert one_chip["memory_bytes_per_chip"]["basis"] == "measured"
    assert one_chip["memory_bytes_per_chip"]["value"] == 1 << 30
