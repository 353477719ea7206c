"""SweepSpec admission: strict types, bounds, plain text, and the memory check of expand_trials
(every way in — the API, `gdn-sweep run`, the JSONL path — expands through it)."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from gdn_core import datasheets
from gdn_core.device_memory import CUDA_CONTEXT_RESERVE_BYTES, JAX_GPU_MEMORY_FRACTION
from gdn_core.memory.step import predict_step_memory
from gdn_core.cp_modes import CPSettings
from gdn_core.presets import get_preset
from gdn_core.train_config import TrainConfig
from service.demo import demo_sweep
from tests.service.conftest import TINY_SWEEP
from workers.grid import expand_trials
from workers import memory_admission
from workers.memory_admission import chip_memory_bytes, host_memory_bytes
from workers.sweep_spec import MAX_CHIPS, MAX_SEQ_LEN, AcceleratorSpec, SweepSpec

H100_27B = dict(name="27b", frameworks=["jax"], modes=["all_gather"], chips=[8],
                model={"preset": "qwen3.5-27b"}, dtypes=["bfloat16"],
                accelerator={"kind": "gpu", "type": "h100"})


def refusal(**fields) -> list[dict]:
    with pytest.raises(ValidationError) as caught:
        SweepSpec.model_validate({**TINY_SWEEP, **fields})
    return caught.value.errors()


@pytest.mark.parametrize("fields, loc, needle", [
    ({"chips": [True]}, ("chips", 0), "valid integer"),
    ({"chips": ["2"]}, ("chips", 0), "valid integer"),
    ({"seq_lens": [False]}, ("seq_lens", 0), "valid integer"),
    ({"repeats": "2"}, ("repeats",), "valid integer"),
    ({"one_chip_baseline": "false"}, ("one_chip_baseline",), "valid boolean"),
    ({"chips": [MAX_CHIPS + 1]}, ("chips",), f"<= {MAX_CHIPS}"),
    ({"seq_lens": [MAX_SEQ_LEN + 1]}, ("seq_lens",), f"<= {MAX_SEQ_LEN}"),
    ({"chips": [0, -3]}, ("chips",), "[0, -3]"),
    ({"name": " \u3000 "}, ("name",), "blank"),
    ({"name": "line\nbreak"}, ("name",), "U+000A"),
    ({"name": "c1\x9b"}, ("name",), "U+009B"),
    ({"name": "half \ud83d pair"}, ("name",), "unpaired surrogate, U+D83D, at position 5"),
], ids=["chips-true", "chips-string", "seq-len-false", "repeats-string", "baseline-string",
        "chips-over", "seq-len-over", "chips-non-positive", "name-blank", "name-newline",
        "name-c1", "name-surrogate"])
def test_spec_refuses_loose_types_bounds_and_unprintable_text(fields, loc, needle):
    errors = refusal(**fields)
    assert any(e["loc"] == loc and needle in e["msg"] for e in errors), errors


def test_bounds_themselves_and_printable_unicode_are_accepted():
    spec = SweepSpec.model_validate({**TINY_SWEEP, "name": "ümlaut 😀 名前",
                                     "chips": [1, MAX_CHIPS], "seq_lens": [MAX_SEQ_LEN],
                                     "trial_timeout_s": 600})
    assert spec.chips == [1, MAX_CHIPS] and spec.seq_lens == [MAX_SEQ_LEN]
    assert spec.trial_timeout_s == 600.0 and spec.admit_over_memory is False


def test_non_finite_timeout_is_refused():
    for value in (float("nan"), float("inf")):
        assert refusal(trial_timeout_s=value)[0]["type"] == "finite_number"


def test_over_memory_point_is_skipped_naming_prediction_and_chip():
    (trial,) = expand_trials(SweepSpec(**H100_27B, seq_lens=[2 ** 24]))
    predicted = predict_step_memory(
        get_preset("qwen3.5-27b"), TrainConfig(seq_len=2 ** 24, dtype="bfloat16"),
        mode="all_gather", chips=8, framework="jax").total
    assert predicted > datasheets.hbm_bytes_per_chip("h100")
    assert f"({predicted} bytes," in trial.skip_reason
    assert f"{predicted / 2 ** 30:.1f} GiB per chip" in trial.skip_reason
    assert "the 80.0 GiB HBM of one h100 chip" in trial.skip_reason
    assert "admit_over_memory: true" in trial.skip_reason

    (forced,) = expand_trials(SweepSpec(**H100_27B, seq_lens=[2 ** 24], admit_over_memory=True))
    assert forced.skip_reason is None and forced.key == trial.key


def test_only_the_points_over_memory_are_skipped():
    # Short sequences of the 27B model fit 8 H100s; the longest does not.
    trials = expand_trials(SweepSpec(**{**H100_27B, "param_shardings": ["fsdp"],
                                        "remats": ["full"]}, seq_lens=[4096, 2 ** 24]))
    assert {t.seq_len: t.skip_reason is None for t in trials} == {4096: True, 2 ** 24: False}


def test_cpu_chips_share_the_expanding_hosts_ram():
    host = host_memory_bytes()
    assert host is not None and host > 0
    memory, what = chip_memory_bytes(AcceleratorSpec(), 4)
    assert memory == host // 4 and "shared by 4 CPU chip(s)" in what
    # 27B on one CPU chip needs terabytes: more than any test host has.
    (trial,) = expand_trials(SweepSpec.model_validate(
        {**TINY_SWEEP, "model": {"preset": "qwen3.5-27b"}, "seq_lens": [2 ** 20]}))
    assert "of RAM shared by 1 CPU chip(s)" in trial.skip_reason


@pytest.mark.parametrize("sweep", [TINY_SWEEP, demo_sweep(2), demo_sweep(4)],
                         ids=["tiny", "demo-2-cores", "demo-4-cores"])
def test_demo_and_tiny_sweeps_are_not_skipped(sweep):
    assert all(t.skip_reason is None for t in expand_trials(SweepSpec.model_validate(sweep)))


@pytest.mark.timeout(120)
def test_a_grid_at_the_cap_expands_quickly_at_the_largest_chip_counts():
    # Predicting memory at 16k chips costs ~0.25 s uncached (the ZeRO partition); a 512-point
    # grid must still be answered while the client waits.
    spec = SweepSpec(**{**H100_27B, "modes": ["all_gather", "p2p", "log_scan", "ulysses"],
                        "frameworks": ["jax", "torch"], "chips": [4096, 8192, MAX_CHIPS],
                        "param_shardings": ["zero1", "fsdp"], "remats": ["none", "full"]},
                     seq_lens=[2 ** k for k in range(20, 25)])
    assert spec.grid_size == 480
    start = time.perf_counter()
    trials = expand_trials(spec)
    assert len(trials) == spec.grid_size and time.perf_counter() - start < 15


# ---------------------------------------------------------------- hybrid dimensions (issue 13)

def test_gdn_only_keys_stay_as_stored_and_hybrid_keys_name_attn_cp_and_layout():
    old = expand_trials(SweepSpec(name="old", frameworks=["torch"], modes=["p2p"],
                                  chips=[1, 2], seq_lens=[64]))
    assert [t.key for t in old] == [
        "torch/none/chips=1/seq_len=64/dtype=float32/param_sharding=replicated/remat=none",
        "torch/p2p/chips=2/seq_len=64/dtype=float32/param_sharding=replicated/remat=none"]
    assert {(t.layers, t.attn_cp, t.layout) for t in old} == {("gdn_only", None, "contiguous")}
    spec = SweepSpec(name="hy", frameworks=["torch"], modes=["p2p"], layers=["gdn_only", "hybrid"],
                     attn_cps=["ring", "ulysses"], layouts=["contiguous", "zigzag"],
                     chips=[1, 2], seq_lens=[64])
    trials = expand_trials(spec)
    # gdn_only: 1 baseline + 2 layouts; hybrid: 1 baseline + 2 attn_cps × 2 layouts
    assert len(trials) == spec.grid_size == 3 + 5
    keys = {t.key for t in trials}
    assert len(keys) == len(trials)
    hybrid_zigzag = next(t for t in trials if t.attn_cp == "ring" and t.layout == "zigzag")
    assert hybrid_zigzag.key.endswith("/remat=none/layers=hybrid/attn_cp=ring/layout=zigzag")
    assert hybrid_zigzag.baseline_key == ("torch/none/chips=1/seq_len=64/dtype=float32/"
                                          "param_sharding=replicated/remat=none/layers=hybrid")
    assert hybrid_zigzag.baseline_key in keys
    gdn_zigzag = next(t for t in trials if t.layers == "gdn_only" and t.layout == "zigzag")
    assert gdn_zigzag.attn_cp is None and gdn_zigzag.key.endswith("/remat=none/layout=zigzag")
    assert hybrid_zigzag.to_model_config().layers == "hybrid"
    assert hybrid_zigzag.cp_settings() == CPSettings(mode="p2p", chips=2, attn_cp="ring",
                                                     layout="zigzag")


@pytest.mark.parametrize("changes, needle", [
    # tiny's attention has 4 query heads: ulysses on 8 chips is refused with the numbers
    (dict(attn_cps=["ulysses"], chips=[8], seq_lens=[256]),
     "attn_cp='ulysses' needs query heads (4) divisible by chips=8"),
    # zigzag cuts the sequence into 2 × chips segments: 100 tokens are not 8 segments
    (dict(layouts=["zigzag"], chips=[4], seq_lens=[100], modes=["ulysses"]),
     "seq_len=100 is not divisible by 8 (2 × chips=4)"),
    # 4 tokens a chip are a contiguous shard, but two zigzag segments of 2 are shorter than
    # tiny's conv halo of 3
    (dict(layouts=["zigzag"], chips=[4], seq_lens=[16]),
     "zigzag segment of 2 tokens"),
], ids=["ulysses-D-over-heads", "zigzag-indivisible", "zigzag-segment-under-halo"])
def test_points_a_mode_or_layout_cannot_serve_are_skipped_with_the_numbers(changes, needle):
    spec = SweepSpec(**{"name": "s", "frameworks": ["torch"], "modes": ["p2p"],
                        "layers": "hybrid", **changes})
    (trial,) = expand_trials(spec)
    assert trial.skip_reason is not None and needle in trial.skip_reason


def test_hybrid_fields_are_validated():
    with pytest.raises(ValidationError, match="attn_cps"):
        SweepSpec(name="s", chips=[2], seq_lens=[64], layers="hybrid", attn_cps=["rings"])
    # a spec dumped with every field (as stored) validates again, nested or not; gdn_only
    # points ignore attn_cps
    spec = SweepSpec(name="s", chips=[2], seq_lens=[64], attn_cps=["ring"])
    assert SweepSpec.model_validate(spec.model_dump()) == spec
    assert {t.attn_cp for t in expand_trials(spec)} == {None}
    with pytest.raises(ValidationError, match="layers"):
        SweepSpec(name="s", chips=[2], seq_lens=[64], layers=["moe"])
    with pytest.raises(ValidationError, match="layouts"):
        SweepSpec(name="s", chips=[2], seq_lens=[64], layouts=["striped"])
    # singular names and single values, as the other grid dimensions take them
    spec = SweepSpec.model_validate({"name": "s", "chips": [2], "seq_lens": [64],
                                     "layers": "hybrid", "attn_cp": "ring", "layout": "zigzag"})
    assert (spec.layers, spec.attn_cps, spec.layouts) == (["hybrid"], ["ring"], ["zigzag"])


def test_hybrid_plans_are_skipped_and_memory_admission_counts_attention():
    spec = SweepSpec(name="p", kinds=["plan"], frameworks=["jax"], layers=["hybrid"],
                     chips=[2], seq_lens=[64])
    (plan,) = expand_trials(spec)
    assert "not planned" in plan.skip_reason
    # all_gather_kv holds the whole sequence's K/V: at a fixed local shard it grows with the
    # chip count by every attention layer's gathered K/V (its gradient goes round a block at a
    # time), ring stays flat (the prediction admission refuses by)
    model = get_preset("qwen3.5-27b", layers="hybrid")

    def predicted(attn_cp, chips):
        train = TrainConfig(batch_size=1, seq_len=8192 * chips, dtype="bfloat16")
        return predict_step_memory(model, train, mode="p2p", chips=chips, framework="jax",
                                   attn_cp=attn_cp).total
    assert predicted("ring", 8) == pytest.approx(predicted("ring", 2), rel=0.02)
    a = model.attention
    gathered = lambda chips: 8192 * chips * 2 * a.num_kv_heads * a.head_dim * 2  # noqa: E731
    layers = model.layer_pattern.count("full_attention")
    assert predicted("all_gather_kv", 8) - predicted("all_gather_kv", 2) == pytest.approx(
        layers * (gathered(8) - gathered(2)) + predicted("ring", 8) - predicted("ring", 2),
        abs=1)


def test_gpu_admission_compares_against_what_each_framework_can_allocate():
    h100 = AcceleratorSpec(kind="gpu", type="h100")
    hbm, nominal = chip_memory_bytes(h100, 8)
    jax_usable, jax_what = chip_memory_bytes(h100, 8, "jax")
    torch_usable, torch_what = chip_memory_bytes(h100, 8, "torch")
    assert jax_usable == int(hbm * JAX_GPU_MEMORY_FRACTION) and "jax trial can allocate" in jax_what
    assert torch_usable == hbm - CUDA_CONTEXT_RESERVE_BYTES and nominal in torch_what
    # A point predicted between the usable and the nominal memory is refused, naming the
    # usable figure: it would run out of memory where the nominal HBM says it fits.
    def predicted(seq_len):
        return predict_step_memory(get_preset("qwen3.5-27b"), TrainConfig(
            seq_len=seq_len, dtype="bfloat16", param_sharding="fsdp", remat="full"),
            mode="all_gather", chips=8, framework="jax").total

    low, high = 1, 2 ** 12  # in steps of 4096 tokens: predicted(low) fits, predicted(high) not
    assert predicted(low * 4096) < jax_usable < predicted(high * 4096)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if predicted(mid * 4096) <= jax_usable else (low, mid)
    assert jax_usable < predicted(high * 4096) <= hbm  # inside the window
    (trial,) = expand_trials(SweepSpec(**{**H100_27B, "param_shardings": ["fsdp"],
                                          "remats": ["full"]}, seq_lens=[high * 4096]))
    assert trial.skip_reason is not None and "a jax trial can allocate" in trial.skip_reason


def test_gpu_admission_reads_the_device_where_it_can_and_names_the_datasheet_otherwise(
        monkeypatch):
    h100 = AcceleratorSpec(kind="gpu", type="h100")
    datasheet, what = chip_memory_bytes(h100, 8, "torch")
    assert datasheet == datasheets.hbm_bytes_per_chip("h100") - CUDA_CONTEXT_RESERVE_BYTES
    assert "(datasheet, gdn_core.datasheets.CHIP_SPECS" in what  # this host has no GPU in use
    # A card reports less than its datasheet's round 80 GiB (an H100 80GB: about 79.6).
    reported = 85_470_085_120 - CUDA_CONTEXT_RESERVE_BYTES
    asked = []

    def device_says(framework, accelerator_type):
        asked.append((framework, accelerator_type))
        return reported, "torch.cuda.mem_get_info total 79.6 GiB of 'NVIDIA H100 80GB HBM3'"
    monkeypatch.setattr(memory_admission, "gpu_usable_bytes_here", device_says)
    measured, what = chip_memory_bytes(h100, 8, "torch")
    assert measured == reported < datasheet and asked == [("torch", "h100")]
    assert "as this process's device reports it (torch.cuda.mem_get_info total 79.6" in what
    assert "datasheet" not in what
    # Without a framework (the nominal figure), and on a TPU, the device is not asked.
    assert chip_memory_bytes(h100, 8)[0] == datasheets.hbm_bytes_per_chip("h100")
    chip_memory_bytes(AcceleratorSpec(kind="tpu", type="v5p"), 8, "jax")
    assert asked == [("torch", "h100")]


def test_admission_counts_the_fused_kernels_workspace(monkeypatch):
    """A torch point that fits with the reference kernels and not with fla's workspace is
    refused for fused only, the reason naming the fused prediction."""
    model = get_preset("tiny", num_layers=4)
    train = TrainConfig(seq_len=8192, dtype="bfloat16")
    reference, fused = (predict_step_memory(model, train, mode="p2p", chips=1,
                                            framework="torch", kernels=kernels)
                        for kernels in ("reference", "fused"))
    assert fused.total - reference.total == fused.kernel_workspace > 0
    usable = reference.total + fused.kernel_workspace // 2  # between the two
    monkeypatch.setattr(memory_admission, "gpu_usable_bytes_here",
                        lambda framework, accelerator_type: (usable, "a stand-in device"))
    trials = expand_trials(SweepSpec(
        name="fused-memory", frameworks=["torch"], kernels=["reference", "fused"], chips=[1],
        seq_lens=[8192], model={"preset": "tiny", "num_layers": 4}, dtypes=["bfloat16"],
        accelerator={"kind": "gpu", "type": "h100"}))
    by_kernels = {t.kernels: t for t in trials}
    assert by_kernels["reference"].skip_reason is None
    assert f"({fused.total} bytes," in by_kernels["fused"].skip_reason
    assert "a stand-in device" in by_kernels["fused"].skip_reason


@pytest.mark.parametrize("kinds, kernels, warmup, refused", [
    (["measure"], ["reference", "fused"], 0, True),
    (["measure"], ["fused"], 1, False),
    (["measure"], ["reference"], 0, False),
    (["plan"], ["reference", "fused"], 0, False),  # plans compile the reference step only
])
def test_fused_kernels_need_a_warmup_step(kinds, kernels, warmup, refused):
    fields = {**TINY_SWEEP, "kinds": kinds, "frameworks": ["jax"], "kernels": kernels,
              "warmup_steps": warmup}
    if not refused:
        assert SweepSpec.model_validate(fields).warmup_steps == warmup
        return
    with pytest.raises(ValidationError) as caught:
        SweepSpec.model_validate(fields)
    (error,) = caught.value.errors()
    assert error["loc"] == ("warmup_steps",)
    assert "warmup_steps=0 with kernels including 'fused'" in error["msg"]
    assert "autotune" in error["msg"] and "warmup_steps >= 1" in error["msg"]


def test_a_gpu_process_rechecks_against_its_device_and_honours_admit_over_memory(monkeypatch):
    """The sweep's expansion had only the datasheet (no GPU on the driver); the trial's own
    process asks its device: a point admitted on the datasheet's "80 GB" but over what the
    card reports is skipped there with both figures named, unless the sweep admits it; CPU
    processes and plans are not asked."""
    from workers.chip_process import ChipProcess

    trial = next(t for t in expand_trials(SweepSpec(
        name="device-recheck", frameworks=["torch"], chips=[1], seq_lens=[8192],
        model={"preset": "tiny", "num_layers": 4}, dtypes=["bfloat16"],
        accelerator={"kind": "gpu", "type": "h100"})) if t.skip_reason is None)
    predicted = predict_step_memory(get_preset("tiny", num_layers=4),
                                    TrainConfig(seq_len=8192, dtype="bfloat16"), mode="p2p",
                                    chips=1, framework="torch").total
    reported = {"bytes": predicted - 1}
    monkeypatch.setattr(memory_admission, "gpu_usable_bytes_here",
                        lambda framework, accelerator_type: (reported["bytes"], "a stand-in"))
    process = object.__new__(ChipProcess)  # the actors' shared half, without Ray
    process.kind = "gpu"
    problem = process.device_memory_problem(trial)
    assert problem is not None and "reports usable (a stand-in)" in problem
    assert f"({predicted} bytes" in problem and "admit_over_memory: true" in problem
    assert process.device_memory_problem(trial.model_copy(update={"admit_over_memory": True})) \
        is None
    reported["bytes"] = predicted  # fits exactly
    assert process.device_memory_problem(trial) is None
    reported["bytes"] = 1
    process.kind = "cpu"
    assert process.device_memory_problem(trial) is None
