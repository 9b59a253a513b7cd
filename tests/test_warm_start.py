"""``psrec train --warm-start``: real runs on local clusters of OS processes
(run A on 1 PS; B warm-started from A's workdir on 2 PS with a changed
spec; B rerun, which resumes its own checkpoint), the values read back from
the checkpoint files with ``tf.train.load_checkpoint``; the state right
after a warm start (in this process, before any step) equal to A's by
value, with and without ``--reset-optimizer``; and the refusals that come
before any server starts (exit 2, one line)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import tensorflow as tf

from tests._forbid import Reached
from tests._forbid import forbid
from tests._proc import assert_no_leftovers
from tests._proc import run_psrec

TIMEOUT = 240
TABLE = "model/sparse_arch/ids/.ATTRIBUTES/VARIABLE_VALUE"
SLOT = ("model/sparse_arch/ids/.OPTIMIZER_SLOT/sparse_optimizer/accumulator/"
        ".ATTRIBUTES/VARIABLE_VALUE")
KERNEL = "model/over_arch/out/kernel/.ATTRIBUTES/VARIABLE_VALUE"
MOMENT = ("model/over_arch/out/kernel/.OPTIMIZER_SLOT/dense_optimizer/m/"
          ".ATTRIBUTES/VARIABLE_VALUE")
ITER = "sparse_optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE"
A_STEPS, B_STEPS = 6, 2
BATCH = 32
# A's features (offsets laid out in this order); B adds `cat` in front (so
# `user` moves by 10 rows) and `brand` at the end (the towers' input
# widens), rehashes `item` and drops `tag`.
USER, ITEM, TAG, CAT, BRAND = 2000, 500, 20, 10, 5
A_FEATURES = [("user", USER), ("item", ITEM), ("tag", TAG)]
B_FEATURES = [("cat", CAT), ("user", USER), ("item", ITEM // 2),
              ("brand", BRAND)]


def _spec(path, categorical) -> str:
    path.write_text(json.dumps({
        "name": "warm", "label": {"name": "label"},
        "tables": [{"name": "ids", "dim": 4}],
        "dense": [{"name": "price", "transform": "log1p"}],
        "categorical": [{"name": n, "table": "ids", "hash_buckets": b}
                        for n, b in categorical]}))
    return str(path)


def _train(workdir, spec, steps, ps, *extra) -> str:
    code, run = run_psrec(
        ["train", "--workdir", workdir, "--spec", spec, "--synthetic-rows",
         600, "--steps", steps, "--batch-size", BATCH, "--workers", 1,
         "--ps", ps, "--input-mode", "static", "--no-export",
         "--keep-best", "none", *extra], TIMEOUT)
    assert_no_leftovers(run, workdir)
    assert code == 0, run.output[-4000:]
    return run.output


def _tensors(prefix) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(str(prefix))
    return {key: reader.get_tensor(key)
            for key, _ in tf.train.list_variables(str(prefix))}


def _equal_rows(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(np.all(a == b, axis=1)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("warm")
    spec_a = _spec(root / "a.json", A_FEATURES)
    spec_b = _spec(root / "b.json", B_FEATURES)
    out_a = _train(root / "A", spec_a, A_STEPS, 1)
    out_b = _train(root / "B", spec_b, B_STEPS, 2, "--warm-start",
                   root / "A")
    # On 1 PS: a resume may change the cluster's shape.
    out_rerun = _train(root / "B", spec_b, B_STEPS + 2, 1, "--warm-start",
                       root / "A")
    return {"root": root, "a": out_a, "b": out_b, "rerun": out_rerun,
            "source": root / "A" / "checkpoints" / f"ckpt-{A_STEPS}"}


@pytest.mark.cluster
@pytest.mark.slow
def test_a_changed_spec_on_another_ps_count_carries_rows_by_value(runs):
    root, out = runs["root"], runs["b"]
    a = _tensors(runs["source"])
    b = _tensors(root / "B" / "checkpoints" / f"ckpt-{B_STEPS}")
    lines = [line for line in out.splitlines()
             if line.startswith("warm start")]
    assert "warm start: feature 'cat' added: its rows are freshly " \
        "initialised" in lines, lines
    assert ("warm start: feature 'user' moved: rows 'ids'[0:2000] -> "
            "'ids'[10:2010]") in lines, lines
    assert any(line.startswith("warm start: feature 'item' re-initialised: "
                               "its hashing changed (hash_buckets 500 -> "
                               "hash_buckets 250)") for line in lines), lines
    assert any(line.startswith("warm start: feature 'tag' dropped")
               for line in lines), lines
    [summary] = [line for line in lines if line.startswith("warm start from")]
    assert summary.startswith(
        f"warm start from {runs['source']}: carried 0 features (0 rows), "
        "moved 1 (2,000 rows), added 2, re-initialised 1, dropped 1; dense "
        "weights re-initialised (shape changed) for "), summary
    assert "optimizer slots carried" in summary
    assert f"steps 0 -> {B_STEPS}" in out  # the step counter starts at 0
    # B's 2 steps of 32 rows touch at most 64 of user's 2,000 rows: every
    # other row is A's, moved by 10 (a fresh table shares none).
    assert a[TABLE].shape == (USER + ITEM + TAG, 4)
    assert b[TABLE].shape == (CAT + USER + ITEM // 2 + BRAND, 4)
    same = _equal_rows(b[TABLE][CAT:CAT + USER], a[TABLE][:USER])
    assert same >= 1 - 2 * BATCH / USER, same
    assert _equal_rows(b[TABLE][:CAT], a[TABLE][:CAT]) == 0.0
    # The optimizer state came along: its iterations go on from A's.
    assert int(b[ITER]) == int(a[ITER]) + B_STEPS
    recorded = json.loads((root / "B/checkpoints/job.json").read_text())
    assert recorded["warm_start"] == str(runs["source"])


@pytest.mark.cluster
@pytest.mark.slow
def test_a_rerun_resumes_its_own_checkpoint_not_the_source(runs):
    out, root = runs["rerun"], runs["root"]
    assert "not applied" in out and "has checkpoints of its own" in out
    assert not re.search(r"^warm start", out, re.M), out[-3000:]
    assert re.search(rf"resumed from .*ckpt-{B_STEPS} at step {B_STEPS}",
                     out), out[-3000:]
    assert f"steps {B_STEPS} -> {B_STEPS + 2}" in out
    recorded = json.loads((root / "B/checkpoints/job.json").read_text())
    assert recorded["warm_start"] == str(runs["source"])


def _warm_started(runs, features, reset: bool):
    """A one-device trainer of A's job with ``features``, warm-started from
    A's checkpoint (nothing trained): its live state by checkpoint key."""
    from psrec.features.spec.spec import FeatureSpec
    from psrec.launch.job.config import JobConfig
    from psrec.ps_cluster.checkpoint.verify import live_tensors
    from psrec.ps_cluster.checkpoint.warm_plan import plan_warm_start
    from psrec.ps_cluster.training.trainer import Trainer
    job = JobConfig.from_dict(json.loads(
        (runs["root"] / "A/checkpoints/job.json").read_text()))
    spec = FeatureSpec.load(_spec(runs["root"] / "new.json", features))
    trainer = Trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), spec,
                      job.model, job.optimizer, job.input)
    result = trainer.warm_start(str(runs["source"]),
                                plan_warm_start(job.spec, spec),
                                reset_optimizer=reset)
    live = {}
    for key, tensor in live_tensors(trainer.checkpoint).items():
        live[key] = np.concatenate(
            [v.read_value().numpy().reshape(-1, *tensor.shape[1:])
             for v, _ in tensor.shards]) if tensor.shape else (
            tensor.shards[0][0].read_value().numpy())
    return result, live


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.parametrize("reset", [False, True])
def test_the_warm_started_state_is_the_source_s_by_value(runs, reset):
    a = _tensors(runs["source"])
    result, live = _warm_started(runs, A_FEATURES, reset)
    assert result.summary.endswith(
        "dense weights carried; optimizer slots "
        + ("reset" if reset else "carried")), result.summary
    assert np.array_equal(live[TABLE], a[TABLE])
    assert np.array_equal(live[KERNEL], a[KERNEL])
    assert np.any(a[MOMENT] != 0)  # A's Adam moment moved from its init
    if reset:
        assert np.all(live[MOMENT] == 0) and np.all(live[SLOT] == 0.1)
        assert int(live[ITER]) == 0
    else:
        assert np.array_equal(live[MOMENT], a[MOMENT])
        assert np.array_equal(live[SLOT], a[SLOT])
        assert int(live[ITER]) == int(a[ITER]) == A_STEPS
    assert int(live["progress/step/.ATTRIBUTES/VARIABLE_VALUE"]) == 0


@pytest.mark.cluster
@pytest.mark.slow
def test_moved_rows_are_the_source_s_exactly(runs):
    a = _tensors(runs["source"])
    result, live = _warm_started(runs, B_FEATURES, reset=False)
    assert np.array_equal(live[TABLE][CAT:CAT + USER], a[TABLE][:USER])
    assert np.array_equal(live[SLOT][CAT:CAT + USER], a[SLOT][:USER])
    assert not np.array_equal(live[TABLE][:CAT], a[TABLE][:CAT])
    assert "over_arch/out/kernel" not in " ".join(result.fresh_dense)
    assert np.array_equal(live[KERNEL], a[KERNEL])  # its shape is unchanged


# -- refusals before any server starts ----------------------------------------------


def _refused(tmp_path, capsys, monkeypatch, source, *flags) -> str:
    from psrec.launch.cli.main import main
    seen = forbid(monkeypatch)
    capsys.readouterr()
    code = main(["train", "--workdir", str(tmp_path / "new"), "--spec",
                 "criteo", "--warm-start", str(source), *flags])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1, err
    assert seen == []  # no data prepared, no server
    # Nothing written but the workdir's lock file (taken before the check).
    assert sorted(p.name for p in (tmp_path / "new").glob("*")) in (
        [], ["train.lock"])
    return err[0]


def _fake_run(workdir, retrieval=None) -> None:
    from psrec.launch.job.config import JobConfig
    config = JobConfig(workdir=workdir)
    data = config.to_dict()
    data["retrieval"] = retrieval
    folder = workdir / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "job.json").write_text(json.dumps(data))
    (folder / "ckpt-5.index").write_bytes(b"")
    (folder / "checkpoint").write_text('model_checkpoint_path: "ckpt-5"\n')


def test_a_missing_source_is_refused(tmp_path, capsys, monkeypatch):
    line = _refused(tmp_path, capsys, monkeypatch, tmp_path / "nowhere")
    assert f"--warm-start {tmp_path / 'nowhere'}: no such file or folder" \
        in line, line
    assert "give another run's workdir" in line


def test_a_source_without_checkpoint_is_refused(tmp_path, capsys,
                                                monkeypatch):
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    line = _refused(tmp_path, capsys, monkeypatch, tmp_path / "empty")
    assert "holds no checkpoint" in line, line


def test_a_source_of_the_other_task_is_refused(tmp_path, capsys,
                                               monkeypatch):
    _fake_run(tmp_path / "retrieval", retrieval={"tower_mlp": [8]})
    line = _refused(tmp_path, capsys, monkeypatch, tmp_path / "retrieval")
    assert "is a retrieval run" in line and "this one is a ranking run" \
        in line, line


def test_reset_optimizer_needs_a_warm_start(tmp_path, capsys, monkeypatch):
    from psrec.launch.cli.main import main
    forbid(monkeypatch)
    code = main(["train", "--workdir", str(tmp_path / "new"),
                 "--reset-optimizer"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1, err
    assert "--reset-optimizer" in err[0] and "--warm-start" in err[0]


def test_a_valid_source_reaches_the_data_with_its_prefix(tmp_path,
                                                         monkeypatch):
    from psrec.launch.cli.main import main
    _fake_run(tmp_path / "a")
    seen = forbid(monkeypatch)
    with pytest.raises(Reached):
        main(["train", "--workdir", str(tmp_path / "new"), "--warm-start",
              str(tmp_path / "a")])
    [config] = seen
    assert config.warm_start == str(tmp_path / "a/checkpoints/ckpt-5")
