"""``psrec advise``: measurements on this machine and the recommendation
rule (ratio above 0.3: communication eats the gain; tables over the memory
budget: parameter servers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from psrec.features import criteo
from psrec.models.config import model_config
from psrec.models.sizing import DeviceMemory
from psrec.models.sizing import SizeEstimate
from psrec.models.sizing import estimate_replicated_bytes
from psrec.ps_cluster.advise import CHOICES
from psrec.ps_cluster.advise import Measurements
from psrec.ps_cluster.advise import gradient_traffic
from psrec.ps_cluster.advise import recommend
from psrec.ps_cluster.advise import traffic_bytes

REPO = Path(__file__).resolve().parents[1]
MEMORY = DeviceMemory("GPU", 16 << 30, "test")
SMALL = SizeEstimate(1 << 20, 1 << 20, 1 << 16, 1 << 17)


def _measured(compute: float, allreduce: float, ps: float) -> Measurements:
    return Measurements(compute_s=compute, allreduce_s=allreduce, ps_s=ps,
                        allreduce_bytes=1, ps_bytes=2,
                        allreduce_devices="2 x CPU")


@pytest.fixture(scope="module")
def default_spec_advice() -> dict:
    """``psrec advise`` on the default criteo spec (all measurements real)."""
    done = subprocess.run(
        [sys.executable, "-m", "psrec", "advise", "--spec", "criteo",
         "--model", "dcn", "--batch-size", "512", "--repeats", "3", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.cluster
def test_advise_recommends_a_strategy_on_the_default_spec(
        default_spec_advice):
    advice = default_spec_advice
    assert advice["spec_name"] == "criteo" and advice["batch_size"] == 512
    assert advice["recommendation"] in CHOICES
    m = advice["measurements"]
    for key in ("compute_s", "allreduce_s", "ps_s"):
        assert 0 < m[key] < 10, key
    assert m["mirrored_ratio"] == pytest.approx(m["allreduce_s"]
                                                / m["compute_s"])
    # The reasons follow the rule from the measured numbers.
    size = SizeEstimate(**{k: advice["size"][k] for k in (
        "table_bytes", "table_slot_bytes", "dense_bytes",
        "dense_slot_bytes")})
    memory = DeviceMemory(**advice["memory"])
    measured = Measurements(**{k: v for k, v in m.items()
                               if not k.endswith("_ratio")})
    choice, reasons = recommend(size, memory, measured,
                                advice["memory_fraction"],
                                local_gpus=advice["local_gpus"])
    assert (choice, list(reasons)) == (advice["recommendation"],
                                       advice["reasons"])
    assert any("T_comm/T_compute" in reason for reason in reasons)
    # The default criteo tables (26 x 10,000 x 16 floats) fit anywhere.
    assert "fit in" in reasons[0]


@pytest.mark.slow
@pytest.mark.cluster
def test_a_huge_table_is_sent_to_parameter_servers_whatever_the_timings(
        default_spec_advice):
    measured = Measurements(**{
        k: v for k, v in default_spec_advice["measurements"].items()
        if not k.endswith("_ratio")})
    huge = estimate_replicated_bytes(criteo(buckets=50_000_000, dim=64),
                                     model_config("dcn"))
    choice, reasons = recommend(huge, MEMORY, measured)
    assert choice == "ps"
    assert "exceed" in reasons[0] and "shard them" in reasons[0]


@pytest.mark.parametrize("ratios, expected", [
    ((0.1, 0.9), "mirrored"),
    ((0.3, 0.9), "mirrored"),  # at the threshold: still worth it
    ((0.31, 0.2), "ps"),
    ((0.5, 0.5), "single-device"),
])
def test_recommendation_rule(ratios, expected):
    mirrored, ps = ratios
    choice, reasons = recommend(SMALL, MEMORY,
                                _measured(1.0, mirrored, ps))
    assert choice == expected
    assert f"all-reduce T_comm/T_compute = {mirrored:.2f}" in " ".join(
        reasons)
    if expected == "single-device":
        assert "communication eats the gain" in reasons[-1]
    if expected == "ps":
        assert "eats the gain of mirrored replicas" in reasons[1]


def test_mirrored_on_a_machine_without_two_gpus_says_where_replicas_go():
    cheap = _measured(1.0, 0.1, 0.9)
    assert len(recommend(SMALL, MEMORY, cheap, local_gpus=8)[1]) == 2
    choice, reasons = recommend(SMALL, MEMORY, cheap, local_gpus=0)
    assert choice == "mirrored"
    assert "this machine has 0 GPU(s)" in reasons[-1]


def test_tables_over_the_budget_mean_ps_even_with_cheap_all_reduce():
    big = SizeEstimate(5 << 30, 5 << 30, 0, 0)  # 10 GiB > 0.5 x 16 GiB
    choice, reasons = recommend(big, MEMORY, _measured(1.0, 0.01, 5.0))
    assert choice == "ps" and "exceed" in reasons[0]
    # With a larger budget the same model fits and all-reduce wins.
    assert recommend(big, MEMORY, _measured(1.0, 0.01, 5.0),
                     memory_fraction=0.9)[0] == "mirrored"


def test_gradient_traffic_counts_dense_floats_and_touched_rows():
    spec = criteo(buckets=100, dim=16)
    traffic = gradient_traffic(spec, model_config("dcn"), batch_size=10,
                               dense_parameters=1000)
    assert traffic == {"dense": 1000, "slices": {"16": 260}}
    assert traffic_bytes(traffic) == 4 * 1000 + 260 * (16 * 4 + 8)
    wide = gradient_traffic(spec, model_config("deepfm"), 10, 5)
    assert wide["slices"] == {"16": 260, "1": 260}


def test_recommend_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"`--memory-fraction` = 0"):
        recommend(SMALL, MEMORY, _measured(1, 1, 1), memory_fraction=0)
    with pytest.raises(ValueError, match=r"`threshold` = -1"):
        recommend(SMALL, MEMORY, _measured(1, 1, 1), threshold=-1)
