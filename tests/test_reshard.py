"""Resharding restores: a checkpoint written with M PS tasks restores into N
PS tasks with every table row, every Adagrad accumulator row and the dense
weights exactly as saved (2 -> 1, 1 -> 3, 2 -> 3), for Adagrad (``[rows,
dim]`` accumulator) and row-wise Adagrad (``[rows, 1]``).

Each cluster shape needs its own process (in-process servers cannot be
stopped), so the work runs in ``tests._ps_helpers reshard`` subprocesses:

1. 2 PS: train, save (checkpoint A).
2. 1 PS: train, save (checkpoint B); restore A and dump (2 -> 1).
3. 3 PS: restore B and dump (1 -> 3); restore A and dump (2 -> 3).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from psrec.features.spec.presets import criteo
from tests._ps_helpers import KERNEL_KEY
from tests._ps_helpers import RESHARD_SPEC_ARGS
from tests._ps_helpers import SLOT_KEY
from tests._ps_helpers import TABLE_KEY
from tests._ps_helpers import helper_result
from tests._ps_helpers import run_helper

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TIMEOUT = 180
INITIAL_ACCUMULATOR = 0.1  # models.optim: Adagrad(initial_accumulator_value)
ROWS = criteo(**RESHARD_SPEC_ARGS).table("categorical").rows


@pytest.fixture(scope="module", params=["adagrad", "rowwise_adagrad"])
def runs(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"reshard-{request.param}")
    optimizer = ["--optimizer", request.param]
    two = helper_result(run_helper(
        ["reshard", "--ps", 2, "--train-to", root / "ckpt-2ps",
         "--out", root / "run-2ps", *optimizer], TIMEOUT))
    one = helper_result(run_helper(
        ["reshard", "--ps", 1, "--train-to", root / "ckpt-1ps",
         "--restore", two["checkpoint"], "--out", root / "run-1ps",
         *optimizer], TIMEOUT))
    three = helper_result(run_helper(
        ["reshard", "--ps", 3, "--restore", one["checkpoint"],
         two["checkpoint"], "--out", root / "run-3ps", *optimizer], TIMEOUT))
    return {"two": two, "one": one, "three": three,
            "slot_dim": 1 if request.param == "rowwise_adagrad" else 4}


def _load(dump: dict) -> dict[str, np.ndarray]:
    return {name: np.load(f"{dump['prefix']}-{name}.npy")
            for name in ("table", "accumulator", "kernel")}


def _expected(path: str) -> dict[str, np.ndarray]:
    keys = dict(tf.train.list_variables(path))
    for key in (TABLE_KEY, SLOT_KEY, KERNEL_KEY):
        assert key in keys, (key, sorted(keys))
    reader = tf.train.load_checkpoint(path)
    return {"table": reader.get_tensor(TABLE_KEY),
            "accumulator": reader.get_tensor(SLOT_KEY),
            "kernel": reader.get_tensor(KERNEL_KEY)}


def test_each_run_shards_its_table_over_all_of_its_ps(runs):
    for name, ps in (("one", 1), ("two", 2), ("three", 3)):
        shards = runs[name]["shards"]
        assert len(shards) == ps, (name, shards)
        assert {device for device, _ in shards} == {
            f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(ps)}
        assert sum(shape[0] for _, shape in shards) == ROWS


def test_checkpoints_hold_trained_state(runs):
    a = _expected(runs["two"]["checkpoint"])
    b = _expected(runs["one"]["checkpoint"])
    for state in (a, b):
        assert state["table"].shape == (ROWS, 4)
        assert state["accumulator"].shape == (ROWS, runs["slot_dim"])
        # Training changed the accumulator of the rows it touched, so a
        # restore that left slots at their initial value cannot pass.
        changed = np.mean(np.any(state["accumulator"] != INITIAL_ACCUMULATOR,
                                 axis=1))
        assert changed > 0.5, changed
    assert not np.array_equal(a["table"], b["table"])
    assert not np.array_equal(a["accumulator"], b["accumulator"])


@pytest.mark.parametrize("case, run, index, source", [
    ("2->1", "one", 0, "two"),
    ("1->3", "three", 0, "one"),
    ("2->3", "three", 1, "two"),
])
def test_restore_into_another_ps_count_is_exact(runs, case, run, index,
                                                source):
    dump = runs[run]["dumps"][index]
    assert dump["checkpoint"] == runs[source]["checkpoint"], case
    restored = _load(dump)
    expected = _expected(runs[source]["checkpoint"])
    for name in ("table", "accumulator", "kernel"):
        assert restored[name].shape == expected[name].shape, (case, name)
        assert np.array_equal(restored[name], expected[name]), (case, name)
    assert np.any(restored["accumulator"] != INITIAL_ACCUMULATOR), case
