"""``psrec advise``: measurements on this machine and the recommendation
rule (ratio above 0.3: communication eats the gain; tables over the memory
budget: parameter servers)."""

from __future__ import annotations

import json
import math

import pytest

from psrec.features import criteo
from psrec.models.optim.sizing import DeviceMemory
from psrec.models.optim.sizing import SizeEstimate
from psrec.models.optim.sizing import estimate_replicated_bytes
from psrec.models.ranking.config import model_config
from psrec.ps_cluster.planner.advise import Measurements
from psrec.ps_cluster.planner.advise import cpu_bf16_flags
from psrec.ps_cluster.planner.advise import recommend
from psrec.ps_cluster.planner.advise_measure import gradient_traffic
from psrec.ps_cluster.planner.advise_measure import traffic_bytes
from tests._proc import run_psrec

MEMORY = DeviceMemory("GPU", 16 << 30, "test")
SMALL = SizeEstimate(1 << 20, 1 << 20, 1 << 16, 1 << 17)
BIG = SizeEstimate(5 << 30, 5 << 30, 0, 0)  # 10 GiB > 0.5 x 16 GiB
BATCH = 512


def _measured(compute: float, allreduce: float, ps: float) -> Measurements:
    return Measurements(compute_s=compute, allreduce_s=allreduce, ps_s=ps,
                        allreduce_bytes=1, ps_bytes=2,
                        allreduce_devices="2 x CPU")


@pytest.fixture(scope="module")
def default_spec_advice(tmp_path_factory) -> dict:
    """``psrec advise`` on the default criteo spec (all measurements real),
    run as an OS process (killed by process group after the timeout)."""
    code, run = run_psrec(["advise", "--spec", "criteo", "--model", "dcn",
                           "--batch-size", BATCH, "--repeats", "3",
                           "--json"], timeout=300)
    assert code == 0, run.output[-3000:]
    lines = [line for line in run.output.splitlines()
             if line.startswith('{"spec_name"')]
    assert len(lines) == 1, run.output[-3000:]
    return json.loads(lines[0])


def _from_json(advice: dict) -> tuple[SizeEstimate, Measurements]:
    size = SizeEstimate(**{k: advice["size"][k] for k in (
        "table_bytes", "table_slot_bytes", "dense_bytes",
        "dense_slot_bytes")})
    measured = Measurements(**{k: v for k, v in advice["measurements"].items()
                               if not k.endswith("_ratio")})
    return size, measured


@pytest.mark.slow
@pytest.mark.cluster
def test_advise_measurements_are_real_and_consistent(default_spec_advice):
    advice = default_spec_advice
    assert advice["spec_name"] == "criteo" and advice["model_name"] == "dcn"
    assert advice["batch_size"] == BATCH
    assert advice["memory_fraction"] == 0.5 and advice["threshold"] == 0.3
    m = advice["measurements"]
    for key in ("compute_s", "allreduce_s", "ps_s"):
        assert math.isfinite(m[key]) and 0 < m[key] < 10, (key, m[key])
    assert m["mirrored_ratio"] == pytest.approx(m["allreduce_s"]
                                                / m["compute_s"], rel=1e-9)
    assert m["ps_ratio"] == pytest.approx(m["ps_s"] / m["compute_s"],
                                          rel=1e-9)
    # The size and the bytes moved are those of this spec and model.
    size, measured = _from_json(advice)
    spec, model = criteo(), model_config("dcn")
    assert size == estimate_replicated_bytes(spec, model)
    assert size.total_bytes == advice["size"]["total_bytes"] > 0
    traffic = gradient_traffic(spec, model, BATCH, size.dense_bytes // 4)
    assert m["allreduce_bytes"] == traffic_bytes(traffic) > 0
    assert m["ps_bytes"] == 2 * m["allreduce_bytes"]
    two = "GPU" if advice["local_gpus"] >= 2 else "CPU"
    assert m["allreduce_devices"] == f"2 x {two}"
    # The recommendation is the rule applied to these very numbers.
    choice, reasons = recommend(size, DeviceMemory(**advice["memory"]),
                                measured, advice["memory_fraction"],
                                advice["threshold"],
                                local_gpus=advice["local_gpus"],
                                bf16_flags=tuple(advice["bf16_flags"]))
    assert (choice, list(reasons)) == (advice["recommendation"],
                                       advice["reasons"])
    expected = ("mirrored" if m["mirrored_ratio"] <= 0.3
                else "ps" if m["ps_ratio"] <= 0.3 else "single-device")
    assert advice["recommendation"] == expected, m
    assert (f"all-reduce T_comm/T_compute = {m['mirrored_ratio']:.2f}"
            in " ".join(advice["reasons"]))
    # The default criteo tables (26 x 10,000 x 16 floats) fit anywhere.
    assert "fit in" in advice["reasons"][0]


@pytest.mark.slow
@pytest.mark.cluster
def test_a_huge_table_is_sent_to_parameter_servers_whatever_the_timings(
        default_spec_advice):
    _, measured = _from_json(default_spec_advice)
    huge = estimate_replicated_bytes(criteo(buckets=50_000_000, dim=64),
                                     model_config("dcn"))
    assert huge.total_bytes > 0.5 * MEMORY.bytes
    choice, reasons = recommend(huge, MEMORY, measured)
    assert choice == "ps"
    assert "exceed" in reasons[0] and "shard them" in reasons[0]
    assert f"PS round trip T_comm/T_compute = {measured.ps_ratio:.2f}" in \
        reasons[1]


# Timings with T_compute = 2 s: the rule compares ratios, not seconds.
@pytest.mark.parametrize("seconds, expected", [
    ((2.0, 0.2, 4.0), "mirrored"),        # all-reduce ratio 0.10
    ((2.0, 0.6, 4.0), "mirrored"),        # 0.30: at the threshold, still
    ((2.0, 0.62, 0.6), "ps"),             # 0.31 > 0.3; PS ratio 0.30
    ((2.0, 0.62, 0.62), "single-device"),  # both 0.31
    ((0.5, 0.2, 0.1), "ps"),              # 0.2 s < 0.3 s, but ratio 0.40
    ((10.0, 2.9, 9.0), "mirrored"),       # 2.9 s > 0.3 s, but ratio 0.29
])
def test_recommendation_rule_on_either_side_of_the_threshold(seconds,
                                                             expected):
    measured = _measured(*seconds)
    choice, reasons = recommend(SMALL, MEMORY, measured)
    assert choice == expected
    text = " ".join(reasons)
    assert "fit in" in reasons[0]
    assert (f"all-reduce T_comm/T_compute = {measured.mirrored_ratio:.2f}"
            in text)
    if expected == "mirrored":
        assert f"{measured.mirrored_ratio:.2f} <= 0.3" in reasons[1]
    if expected == "ps":
        assert "eats the gain of mirrored replicas" in reasons[1]
        assert (f"PS round trip T_comm/T_compute = {measured.ps_ratio:.2f} "
                "<= 0.3") in reasons[2]
    if expected == "single-device":
        assert f"PS round trip {measured.ps_ratio:.2f} both exceed 0.3" \
            in reasons[1]
        assert "communication eats the gain" in reasons[-1]


def test_the_threshold_argument_moves_the_decision():
    measured = _measured(1.0, 0.2, 0.1)
    assert recommend(SMALL, MEMORY, measured)[0] == "mirrored"
    assert recommend(SMALL, MEMORY, measured, threshold=0.15)[0] == "ps"
    choice, reasons = recommend(SMALL, MEMORY, measured, threshold=0.05)
    assert choice == "single-device" and "exceed 0.05" in reasons[-1]


@pytest.mark.parametrize("seconds", [
    (1.0, 0.01, 5.0),  # all-reduce nearly free
    (1.0, 5.0, 0.01),  # PS nearly free
    (1.0, 5.0, 5.0),   # both expensive
])
def test_tables_over_the_budget_mean_ps_whatever_the_timings(seconds):
    measured = _measured(*seconds)
    choice, reasons = recommend(BIG, MEMORY, measured)
    assert choice == "ps"
    assert "10.000 GiB per replica exceed 0.5 of one GPU's 16.0 GiB " \
        "(8.00 GiB)" in reasons[0]
    assert reasons[1] == ("PS round trip T_comm/T_compute = "
                          f"{measured.ps_ratio:.2f}")
    # With a larger budget the same model fits and the timings decide.
    fits = recommend(BIG, MEMORY, measured, memory_fraction=0.9)
    assert "fit in" in fits[1][0]
    assert fits[0] == ("mirrored" if measured.mirrored_ratio <= 0.3
                       else "ps" if measured.ps_ratio <= 0.3
                       else "single-device")


def test_mirrored_on_a_machine_without_two_gpus_says_where_replicas_go():
    cheap = _measured(1.0, 0.1, 0.9)
    assert len(recommend(SMALL, MEMORY, cheap, local_gpus=8)[1]) == 2
    choice, reasons = recommend(SMALL, MEMORY, cheap, local_gpus=0)
    assert choice == "mirrored"
    assert "this machine has 0 GPU(s)" in reasons[-1]


def test_gradient_traffic_counts_dense_floats_and_touched_rows():
    spec = criteo(buckets=100, dim=16)
    traffic = gradient_traffic(spec, model_config("dcn"), batch_size=10,
                               dense_parameters=1000)
    assert traffic == {"dense": 1000, "slices": {"16": 260}}
    assert traffic_bytes(traffic) == 4 * 1000 + 260 * (16 * 4 + 8)
    wide = gradient_traffic(spec, model_config("deepfm"), 10, 5)
    assert wide["slices"] == {"16": 260, "1": 260}


def test_recommend_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"`memory_fraction` = 0"):
        recommend(SMALL, MEMORY, _measured(1, 1, 1), memory_fraction=0)
    with pytest.raises(ValueError, match=r"`threshold` = -1"):
        recommend(SMALL, MEMORY, _measured(1, 1, 1), threshold=-1)


def test_a_cpu_with_bfloat16_instructions_is_told_of_mixed_precision(
        tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f "
                    "avx512_bf16 fma\n")
    assert cpu_bf16_flags(str(info)) == ("avx512_bf16",)
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n")
    assert cpu_bf16_flags(str(info)) == ()
    assert cpu_bf16_flags(str(tmp_path / "missing")) == ()
    measured = _measured(2.0, 0.2, 4.0)
    plain = recommend(SMALL, MEMORY, measured, local_gpus=0)
    told = recommend(SMALL, MEMORY, measured, local_gpus=0,
                     bf16_flags=("avx512_bf16",))
    assert told[0] == plain[0] and told[1][:-1] == plain[1]
    assert "--mixed-precision" in told[1][-1] and "avx512_bf16" in told[1][-1]
    with_gpu = recommend(SMALL, MEMORY, measured, local_gpus=1,
                         bf16_flags=("avx512_bf16",))
    assert not any("--mixed-precision" in r for r in with_gpu[1])
