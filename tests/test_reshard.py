"""Resharding restores: a checkpoint written with M PS tasks restores into N
PS tasks with every table row, every optimizer slot row and the dense
weights exactly as saved (2 -> 1, 1 -> 3, 2 -> 3), for tables on each
sparse optimizer (``tests._ps_helpers.reshard_spec``: the flag's Adagrad
with its ``[rows, dim]`` accumulator, row-wise Adagrad's ``[rows, 1]`` one,
FTRL's accumulator and linear at its own rate, SGD without slots).

Each cluster shape needs its own process (in-process servers cannot be
stopped), so the work runs in ``tests._ps_helpers reshard`` subprocesses:

1. 2 PS: train, save (checkpoint A).
2. 1 PS: train, save (checkpoint B); restore A and dump (2 -> 1).
3. 3 PS: restore B and dump (1 -> 3); restore A and dump (2 -> 3).

After step 1 the 2-PS run changes every 7th row of each table and its
slots and saves a delta checkpoint after A; step 3 then restores A plus
that delta (a resume of the 2-PS run's folder on 3 PS).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests._ps_helpers import KERNEL_KEY
from tests._ps_helpers import helper_result
from tests._ps_helpers import reshard_spec
from tests._ps_helpers import run_helper

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TIMEOUT = 180
INITIAL_ACCUMULATOR = 0.1  # models.optim: initial_accumulator_value
SLOT = "/.OPTIMIZER_SLOT/"
# The run's checkpoint keys of the slots, by table: (optimizer's checkpoint
# name, slot, its width: None = the table's dim).
SLOTS = {"categorical": [("sparse_optimizer", "accumulator", None)],
         "second": [("sparse_optimizer_rowwise_adagrad", "accumulator", 1)],
         "third": [("sparse_optimizer_ftrl_lr0p05", "accumulator", None),
                   ("sparse_optimizer_ftrl_lr0p05", "linear", None)],
         "fourth": []}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("reshard")
    two = helper_result(run_helper(
        ["reshard", "--ps", 2, "--train-to", root / "ckpt-2ps", "--delta",
         "--out", root / "run-2ps"], TIMEOUT))
    one = helper_result(run_helper(
        ["reshard", "--ps", 1, "--train-to", root / "ckpt-1ps",
         "--restore", two["checkpoint"], "--out", root / "run-1ps"],
        TIMEOUT))
    three = helper_result(run_helper(
        ["reshard", "--ps", 3, "--restore", one["checkpoint"],
         two["checkpoint"], "--chain", root / "ckpt-2ps",
         "--out", root / "run-3ps"], TIMEOUT))
    return {"two": two, "one": one, "three": three, "slots": SLOTS,
            "tables": {t.name: (t.rows, t.dim)
                       for t in reshard_spec().tables}}


def _key(table: str, group: str | None = None, slot: str = "") -> str:
    return (f"model/sparse_arch/{table}" + (f"{SLOT}{group}/{slot}" if group
                                            else "")
            + "/.ATTRIBUTES/VARIABLE_VALUE")


def _expected(runs, path: str) -> dict[str, np.ndarray]:
    """The checkpoint's tables, slots and a kernel, by key (each expected
    key present, of the expected shape)."""
    keys = dict(tf.train.list_variables(path))
    reader = tf.train.load_checkpoint(path)
    out = {KERNEL_KEY: reader.get_tensor(KERNEL_KEY)}
    for table, (rows, dim) in runs["tables"].items():
        out[_key(table)] = reader.get_tensor(_key(table))
        assert out[_key(table)].shape == (rows, dim)
        for group, slot, width in runs["slots"][table]:
            key = _key(table, group, slot)
            assert key in keys, (key, sorted(keys))
            out[key] = reader.get_tensor(key)
            assert out[key].shape == (rows, width or dim), key
    return out


def test_each_run_shards_its_tables_and_slots_over_all_of_its_ps(runs):
    for name, ps in (("one", 1), ("two", 2), ("three", 3)):
        shards = runs[name]["shards"]
        assert len(shards) == sum(1 + len(s) for s in runs["slots"].values())
        for table, (rows, _) in runs["tables"].items():
            placed = shards[_key(table)]
            assert len(placed) == ps, (name, table)
            assert {device for device, _ in placed} == {
                f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(ps)}
            assert sum(shape[0] for _, shape in placed) == rows
            for group, slot, _ in runs["slots"][table]:  # beside its shard
                assert [(d, s[0]) for d, s in shards[_key(
                    table, group, slot)]] == [(d, s[0]) for d, s in placed]


def test_checkpoints_hold_trained_state(runs):
    a = _expected(runs, runs["two"]["checkpoint"])
    b = _expected(runs, runs["one"]["checkpoint"])
    for state in (a, b):
        for key, value in state.items():
            if SLOT not in key:
                continue
            # Training changed the slots of the rows it touched, so a
            # restore that left slots at their initial value cannot pass.
            initial = 0.0 if key.split("/")[-3] == "linear" else (
                INITIAL_ACCUMULATOR)
            changed = np.mean(np.any(value != initial, axis=1))
            assert changed > 0.5, (key, changed)
    for key in a.keys() - {KERNEL_KEY}:
        assert not np.array_equal(a[key], b[key]), key


@pytest.mark.parametrize("case, run, index, source", [
    ("2->1", "one", 0, "two"),
    ("1->3", "three", 0, "one"),
    ("2->3", "three", 1, "two"),
])
def test_restore_into_another_ps_count_is_exact(runs, case, run, index,
                                                source):
    dump = runs[run]["dumps"][index]
    assert dump["checkpoint"] == runs[source]["checkpoint"], case
    expected = _expected(runs, runs[source]["checkpoint"])
    assert set(dump["files"]) == set(expected), case
    for key, value in expected.items():
        restored = np.load(dump["files"][key])
        assert restored.shape == value.shape, (case, key)
        assert np.array_equal(restored, value), (case, key)
        if SLOT in key and "accumulator" in key:
            assert np.any(restored != INITIAL_ACCUMULATOR), (case, key)


def test_a_delta_chain_restores_into_another_ps_count_by_value(runs):
    """The rows a delta written by 2 PS holds land, on 3 PS, in the shards
    that hold those rows now: the resumed state equals the 2-PS run's state
    after the delta, every table, slot and the kernel; and the delta moved
    rows (it is not A alone)."""
    chain = runs["three"]["chain"]
    assert chain["checkpoint"] == runs["two"]["delta"]
    assert chain["checkpoint"].endswith("deltas/delta-31")
    after = runs["two"]["after_delta"]
    full = _expected(runs, runs["two"]["checkpoint"])
    assert set(chain["files"]) == set(after) == set(full)
    for key, path in after.items():
        expected = np.load(path)
        assert np.array_equal(np.load(chain["files"][key]), expected), key
        if key != KERNEL_KEY:  # every table and slot had rows changed
            assert not np.array_equal(expected, full[key]), key
