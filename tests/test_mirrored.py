"""The replicated strategies through the one Trainer: MirroredStrategy on 2
logical CPU devices, MultiWorkerMirroredStrategy over loopback, sync batch
norm, mixed precision, gradient accumulation, periodic evaluation, the stall
watchdog, the size guard and the serving export.

The CPU can only be split into logical devices before TensorFlow sets up its
devices, which the pytest process may already have done (other tests, the
in-process PS cluster). So each 2-replica check runs this file as a script
in a fresh process (``python -m tests.test_mirrored CHECK ARGS``), which
prints one JSON line of results; the test asserts on them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

# Losses of mirrored (2 replicas) and single-device training may differ only
# by float reduction order: measured differences are ~1e-7; allowed 1e-4.
LOSS_TOLERANCE = 1e-4
_MANY = "--many"  # the script's argument: run the named checks in turn


def _run(name: str, *args: str, timeout: float = 240
         ) -> subprocess.CompletedProcess:
    """Runs one check of this file in a fresh process with 2 CPU devices."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1")
    env.pop("TF_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "tests.test_mirrored", name, *args],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env,
        stdin=subprocess.DEVNULL, check=False)


def _run_check(name: str, *args: str, timeout: float = 240) -> dict:
    """A check's JSON result (the check must exit 0)."""
    done = _run(name, *args, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, (
        f"check {name} failed (exit {done.returncode}):\n"
        + "\n".join(done.stderr.splitlines()[-30:]))
    return json.loads(lines[-1])


# The checks without arguments run one after the other in one fresh process
# (one TensorFlow start-up instead of one each: CI time); each builds its
# own strategies and models, and one that raises reports its traceback
# without hiding the others' results.
_SHARED_CHECKS = ("equivalence", "sync_batch_norm", "accumulation",
                  "mixed_precision", "towers_and_attention")


@pytest.fixture(scope="module")
def shared_checks() -> dict:
    """``{check: JSON result or {"error": traceback}}`` of _SHARED_CHECKS."""
    done = _run(_MANY, *_SHARED_CHECKS, timeout=480)
    found = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            found[record.pop("check")] = record
    assert done.returncode == 0 and set(found) == set(_SHARED_CHECKS), (
        f"shared checks failed (exit {done.returncode}), results of "
        f"{sorted(found)}:\n" + "\n".join(done.stderr.splitlines()[-30:]))
    return found


def _shared_result(shared_checks: dict, name: str) -> dict:
    """One shared check's result; fails with its traceback if it raised."""
    record = shared_checks[name]
    assert "error" not in record, f"check {name} failed:\n{record['error']}"
    return record["result"]


# The stall check's timeout: long enough that building the input pipeline
# on a loaded 2-core CI machine never counts as a stall (1 s did, once),
# short against the hung call (20x as long).
_STALL_TIMEOUT = 6.0


# -- tests -----------------------------------------------------------------------


@pytest.mark.slow
def test_mirrored_on_two_replicas_matches_single_device_training(
        shared_checks):
    out = _shared_result(shared_checks, "equivalence")
    assert out["replicas"] == {"one": 1, "mirrored": 2}
    one, mirrored = np.array(out["one"]), np.array(out["mirrored"])
    assert len(one) == len(mirrored) == 6  # mean loss of each 2 updates
    assert np.abs(one - mirrored).max() < LOSS_TOLERANCE, (one, mirrored)
    assert out["weights_max_diff"] < 1e-3
    assert np.ptp(one) > 10 * LOSS_TOLERANCE  # the losses did move
    # Sync batch norm: global statistics, so still equal to one device ...
    sync = np.array(out["mirrored_sync_bn"])
    assert np.abs(np.array(out["one_bn"]) - sync).max() < LOSS_TOLERANCE
    # ... while per-replica batch norm differs (the check can tell).
    local = np.array(out["mirrored_local_bn"])
    assert np.abs(np.array(out["one_bn"]) - local).max() > 10 * LOSS_TOLERANCE
    # The DirectExecutor reports its calls like the PS path's closures.
    assert out["describe"].startswith("0 call(s) in flight")
    assert "step 12" in out["describe"]


@pytest.mark.slow
def test_sync_batch_norm_normalizes_with_global_statistics(shared_checks):
    out = _shared_result(shared_checks, "sync_batch_norm")
    x0, x1 = np.array(out["inputs"][0]), np.array(out["inputs"][1])
    both = np.concatenate([x0, x1])
    mean, var = both.mean(axis=0), both.var(axis=0)  # by hand: global
    eps = out["epsilon"]
    for replica, x in enumerate((x0, x1)):
        expected = (x - mean) / np.sqrt(var + eps)
        np.testing.assert_allclose(out["sync"][replica], expected,
                                   rtol=1e-4, atol=1e-4)
        local = (x - x.mean(axis=0)) / np.sqrt(x.var(axis=0) + eps)
        np.testing.assert_allclose(out["batch"][replica], local, rtol=1e-4,
                                   atol=1e-4)
        assert np.abs(expected - local).max() > 0.5  # the two differ
    momentum = out["momentum"]
    np.testing.assert_allclose(out["moving_mean"], (1 - momentum) * mean,
                               rtol=1e-4, atol=1e-5)
    assert out["model_norms_synchronized"] == [True, True]


@pytest.mark.slow
def test_mixed_precision_keeps_float32_logits_and_loss(shared_checks):
    out = _shared_result(shared_checks, "mixed_precision")
    for name, dtype in out["model_logits"].items():
        assert dtype == "float32", name
    assert set(out["compute_dtypes"]) == {"bfloat16"}
    assert out["variable_dtypes"] == ["float32"]
    assert out["logit_layer_dtype"] == "float32"
    for policy in ("mixed_bfloat16", "mixed_float16"):
        run = out["trained"][policy]
        assert run["logits_dtype"] == "float32"
        assert all(np.isfinite(run["losses"]))
        assert run["replicas"] == 2
    assert out["trained"]["mixed_float16"]["loss_scale"] > 0
    assert "loss_scale" not in out["trained"]["mixed_bfloat16"]


@pytest.mark.slow
def test_task_towers_and_attended_histories_train_on_two_replicas(
        shared_checks):
    """MMoE over several labels (ESMM's given task among them) and a DIN
    and a BST history train and evaluate under MirroredStrategy on 2
    replicas: every gate, expert and attention weight moves, and each eval
    row (and each task's) is counted once."""
    out = _shared_result(shared_checks, "towers_and_attention")
    for name in ("mmoe", "attention"):
        run = out[name]
        assert run["replicas"] == 2 and run["step"] == 6, (name, run)
        assert run["finite"] and run["moved"] and all(
            run["moved"].values()), (name, run)
        assert run["eval_count"] == run["eval_rows"] > 0, (name, run)
    assert out["mmoe"]["tasks"] == ["click", "like", "rating", "buy"]
    assert len(out["mmoe"]["moved"]) == 2 * (4 + 3)  # 4 gates, 3 experts
    assert set(out["attention"]["moved"]) >= {"seen_din", "seen_bst"}


@pytest.mark.slow
def test_gradient_accumulation_equals_one_k_times_larger_batch(shared_checks):
    out = _shared_result(shared_checks, "accumulation")
    assert out["replicas"] == 2
    # Same rows, same summed gradient, one SGD update per k micro-batches.
    assert out["weights_max_diff"] < 1e-5
    np.testing.assert_allclose(out["accumulated"], out["large"], atol=1e-5)
    assert out["updates"] == {"accumulated": 3, "large": 3}
    # Applying every micro-batch separately would not match (sensitivity).
    assert out["unaccumulated_max_diff"] > 1e-3


@pytest.mark.slow
def test_mirrored_job_evaluates_checkpoints_and_exports_the_ps_signature(
        tmp_path):
    out = _run_check("job", str(tmp_path))
    assert out["strategy"] == "mirrored"
    assert out["replicas"] == 2 and out["step"] == 6
    assert out["precision"] == "mixed_bfloat16"
    assert out["micro_batches"] == 2
    record = json.loads((tmp_path / "checkpoints" / "job.json").read_text())
    assert record["model"]["batch_norm"] == "sync"
    assert record["strategy"]["kind"] == "mirrored"
    _assert_ps_serving_signature(Path(out["export"]), out["spec"])
    assert out["eval"]["count"] > 0
    # --eval-every 3 of 6 steps: an intermediate evaluation at step 3 (a
    # line and TensorBoard scalars), and the final one at step 6.
    assert [line.split(":")[0] for line in out["eval_lines"]] == [
        "step 3", "step 6"], out["eval_lines"]
    assert out["eval_scalars"] == {"eval/auc": [3, 6],
                                   "eval/logloss": [3, 6]}
    assert out["checkpoint_lines"] == ["step 3", "step 6"]
    # A rerun with more steps resumes from the verified checkpoint.
    resumed = out["resumed"]
    assert (resumed["start_step"], resumed["step"]) == (6, 9)
    assert resumed["checkpoint"].endswith("ckpt-9")


@pytest.mark.slow
@pytest.mark.cluster  # a psrec job in a subprocess
def test_mirrored_job_stall_fires_the_watchdog_with_the_pending_call(
        tmp_path):
    """--stall-timeout under mirrored: a train call that never returns ends
    the job with the retryable code after describing the call in flight."""
    done = _run("stall", str(tmp_path), timeout=180)
    err = done.stderr
    assert done.returncode == 138, err[-3000:]
    assert "psrec watchdog: no training progress for" in err
    assert f"(--stall-timeout {_STALL_TIMEOUT:g})" in err
    assert ("1 call(s) in flight (the oldest is awaited); step 0; "
            "no results yet") in err
    assert "psrec watchdog: exiting with retryable code 138" in err
    assert "in stalled_call" in err  # the stacks show the hung call
    assert "NOT REACHED" not in done.stdout


@pytest.mark.slow
@pytest.mark.cluster
def test_two_worker_multi_worker_mirrored_run_only_chief_checkpoints(
        tmp_path):
    from psrec.features.spec.presets import criteo
    from tests._proc import assert_no_leftovers
    from tests._proc import run_psrec
    spec = criteo(buckets=100, dim=4)
    spec_file = spec.save(tmp_path / "spec.yaml")
    workdir = tmp_path / "run"
    code, run = run_psrec([
        "train", "--strategy", "multi-worker-mirrored", "--workers", "2",
        "--collective", "ring", "--spec", spec_file,
        "--synthetic-rows", "3000", "--batch-size", "64", "--steps", "8",
        "--steps-per-closure", "4", "--checkpoint-every", "4",
        "--log-every", "4", "--workdir", workdir], timeout=420)
    assert code == 0, run.output[-4000:]
    assert_no_leftovers(run, workdir)
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["strategy"] == "multi-worker-mirrored"
    assert summary["replicas"] == 2 and summary["workers"] == 2
    assert summary["step"] == 8
    assert Path(summary["checkpoint"]).name == "ckpt-8"
    # Only the chief's checkpoint folder holds checkpoint files.
    indexes = sorted(p.relative_to(workdir)
                     for p in workdir.rglob("ckpt-*.index"))
    assert indexes == [Path("checkpoints/ckpt-4.index"),
                       Path("checkpoints/ckpt-8.index")]
    # Worker 1 saved (collectively) into a scratch folder, now gone.
    assert not list(workdir.glob(".checkpoints-*"))
    _assert_ps_serving_signature(Path(summary["export"]), spec.to_dict())
    assert summary["eval"] is not None and summary["eval"]["count"] == 600


def test_size_guard_stops_the_cli_with_the_size_and_ps_advice(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "psrec", "train", "--strategy", "mirrored",
         "--memory-fraction", "0.000001", "--workdir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "psrec train: error: replicated tables and optimizer slots" in (
        done.stderr)
    assert "GiB" in done.stderr and "Use --strategy ps" in done.stderr
    # The library names the field; the CLI's error line, the flag.
    assert "`--memory-fraction` = 1e-06" in done.stderr, done.stderr
    assert "StrategyConfig" not in done.stderr
    assert not (tmp_path / "data").exists()  # stopped before any data work


def test_replicated_options_name_the_argument_and_value():
    from psrec.launch.cli.main import main
    from psrec.launch.job.config import StrategyConfig
    from psrec.ps_cluster.cluster.strategy import StrategyError
    from psrec.ps_cluster.cluster.strategy import build_replicated_strategy
    with pytest.raises(StrategyError, match=r"`StrategyConfig.collective` = 'ring'"):
        build_replicated_strategy("mirrored", "ring")
    with pytest.raises(StrategyError, match=r"`StrategyConfig.kind` = 'ps'"):
        build_replicated_strategy("ps")
    with pytest.raises(ValueError, match=r"`StrategyConfig.kind` = 'tpu'"):
        StrategyConfig(kind="tpu")
    with pytest.raises(ValueError, match=r"`StrategyConfig.grad_accum_steps` = 0"):
        StrategyConfig(grad_accum_steps=0)
    with pytest.raises(ValueError, match=r"`StrategyConfig.memory_fraction` = 1.5"):
        StrategyConfig(kind="mirrored", memory_fraction=1.5)
    assert main(["train", "--strategy", "mirrored", "--cluster",
                 "c.json"]) == 2


def test_accumulated_table_gradients_stay_sparse():
    import tensorflow as tf

    from psrec.models.optim.accumulation import add_gradients
    a = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([1, 4]),
                         tf.constant([10, 3]))
    b = tf.IndexedSlices(2 * tf.ones([1, 3]), tf.constant([4]),
                         tf.constant([10, 3]))
    total = add_gradients([a, tf.ones([2]), None], [b, tf.ones([2]), None])
    assert isinstance(total[0], tf.IndexedSlices)
    dense = tf.math.unsorted_segment_sum(total[0].values, total[0].indices, 10)
    np.testing.assert_allclose(dense.numpy()[[1, 4]], [[1] * 3, [3] * 3])
    np.testing.assert_allclose(total[1].numpy(), [2, 2])
    assert total[2] is None
    with pytest.raises(ValueError, match="has 1 gradients but the sum has 2"):
        add_gradients(total[:2], [b])


def _assert_ps_serving_signature(export: Path, spec_dict: dict) -> None:
    """The export takes the raw columns of the PS path's signature."""
    import tensorflow as tf

    from psrec.features.spec.spec import FeatureSpec
    from psrec.models.serving.export import serving_signature
    spec = FeatureSpec.from_dict(spec_dict)
    loaded = tf.saved_model.load(str(export))
    function = loaded.signatures["serving_default"]
    inputs = function.structured_input_signature[1]
    expected = serving_signature(spec)
    assert set(inputs) == set(expected)
    for name, tensor_spec in expected.items():
        assert inputs[name].dtype == tensor_spec.dtype, name
        assert inputs[name].shape.as_list() == tensor_spec.shape.as_list()
    raw = {f.name: tf.constant([1.0, float("nan")]) for f in spec.dense}
    raw.update({f.name: tf.constant(["a", ""]) for f in spec.categorical})
    out = function(**raw)
    assert set(out) == {"probability", "logit"}
    assert out["logit"].dtype == tf.float32 and out["logit"].shape == (2,)
    assert np.all((out["probability"].numpy() > 0)
                  & (out["probability"].numpy() < 1))


# -- the checks, run as a script with 2 logical CPU devices ----------------------


def _trainer(strategy, spec, model, optimizer, batch, **kwargs):
    from psrec.data.input.config import InputConfig
    from psrec.ps_cluster.training.trainer import Trainer
    return Trainer(strategy, spec, model, optimizer,
                   InputConfig(batch_size=batch), **kwargs)


def _train(trainer, dataset_fn, loop) -> tuple[object, list[float]]:
    """Trains; returns the result and the mean loss of each call."""
    losses: list[float] = []
    result = trainer.train(dataset_fn, loop, on_progress=lambda step, loss,
                           n: losses.append(loss))
    return result, losses


@functools.cache
def _strategies():
    """(one-device, mirrored): one pair per process. The shared checks run
    in one process; a second MirroredStrategy there would reuse the first
    one's collective instance keys (TensorFlow aborts: shape mismatch)."""
    from psrec.ps_cluster.cluster.strategy import build_replicated_strategy
    return (build_replicated_strategy("one-device"),
            build_replicated_strategy("mirrored"))


def _check_equivalence() -> dict:
    from psrec.features.spec.presets import criteo
    from psrec.models.optim.config import OptimizerConfig
    from psrec.models.ranking.config import model_config
    from psrec.ps_cluster.training.config import LoopConfig
    from tests._ps_helpers import in_order_dataset_fn
    from tests._ps_helpers import synthetic_rows
    spec = criteo(buckets=100, dim=4)
    data = synthetic_rows(spec, 2048)
    optimizer = OptimizerConfig(warmup_steps=4, base_batch_size=64,
                                dense_lr=0.01)
    loop = LoopConfig(steps=12, steps_per_closure=2, checkpoint_every=0)
    one_strategy, mirrored_strategy = _strategies()
    out: dict = {"replicas": {}}
    runs = [  # (key, batch norm, strategy); BN runs share initial weights
        ("one", "none", one_strategy), ("mirrored", "none", mirrored_strategy),
        ("one_bn", "sync", one_strategy),
        ("mirrored_sync_bn", "sync", mirrored_strategy),
        ("mirrored_local_bn", "batch", mirrored_strategy)]
    initial: dict = {}
    trainers = {}
    for key, bn, strategy in runs:
        model = model_config("dcn", top_mlp=(32, 16), batch_norm=bn)
        trainer = _trainer(strategy, spec, model, optimizer, 64)
        family = bn == "none"
        initial.setdefault(family, trainer.model.get_weights())
        trainer.model.set_weights(initial[family])  # same initial values
        result, out[key] = _train(trainer, in_order_dataset_fn(data, 64),
                                  loop)
        trainers[key] = trainer
        if bn == "none":
            out["replicas"][key] = result.replicas
    out["weights_max_diff"] = max(
        float(np.abs(a - b).max()) for a, b in zip(
            trainers["one"].model.get_weights(),
            trainers["mirrored"].model.get_weights()))
    out["describe"] = trainers["mirrored"].describe_pending()
    return out


def _check_sync_batch_norm() -> dict:
    import tensorflow as tf

    from psrec.features.spec.presets import criteo
    from psrec.models.build import build_model
    from psrec.models.ranking.blocks import batch_norm_layer
    from psrec.models.ranking.config import model_config
    _, strategy = _strategies()
    rng = np.random.default_rng(3)
    inputs = [rng.normal(0, 1, (4, 3)).astype(np.float32),
              rng.normal(5, 3, (4, 3)).astype(np.float32)]
    momentum, epsilon = 0.5, 1e-3
    out = {"inputs": [x.tolist() for x in inputs], "epsilon": epsilon,
           "momentum": momentum}
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(inputs[ctx.replica_id_in_sync_group]))
    for kind in ("sync", "batch"):
        with strategy.scope():
            layer = batch_norm_layer(kind, momentum=momentum,
                                     epsilon=epsilon)
            layer.build((None, 3))
        result = strategy.run(tf.function(
            lambda x: layer(x, training=True)), args=(values,))
        out[kind] = [r.numpy().tolist()
                     for r in strategy.experimental_local_results(result)]
        if kind == "sync":
            out["moving_mean"] = layer.moving_mean.numpy().tolist()
    with strategy.scope():
        model = build_model(criteo(buckets=10, dim=4),
                            model_config("dcn", top_mlp=(8, 4),
                                         batch_norm="sync"))
    out["model_norms_synchronized"] = [
        bool(n.synchronized) for n in model.over_arch.norms]
    return out


def _check_mixed_precision() -> dict:
    import tf_keras

    from psrec.features.spec.presets import criteo
    from psrec.features.spec.presets import movielens
    from psrec.models.build import build_model
    from psrec.models.optim.config import OptimizerConfig
    from psrec.models.ranking.config import MODEL_PRESETS
    from psrec.models.ranking.config import model_config
    from psrec.models.ranking.model import example_batch
    from psrec.ps_cluster.training.config import LoopConfig
    from tests._ps_helpers import in_order_dataset_fn
    from tests._ps_helpers import synthetic_rows
    out: dict = {"model_logits": {}, "trained": {}}
    tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        for name in MODEL_PRESETS:
            for spec in (criteo(buckets=20, dim=4), movielens(dim=4)):
                model = build_model(spec, model_config(name))
                logits = model(example_batch(spec, 3), training=True)
                out["model_logits"][f"{name}/{spec.name}"] = logits.dtype.name
        out["compute_dtypes"] = sorted(
            {layer.compute_dtype for layer in model.over_arch.hidden})
        out["variable_dtypes"] = sorted(
            {v.dtype.name for v in model.trainable_variables})
        out["logit_layer_dtype"] = model.over_arch.out.compute_dtype
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")
    spec = criteo(buckets=50, dim=4)
    data = synthetic_rows(spec, 1024)
    _, strategy = _strategies()
    for policy in ("mixed_bfloat16", "mixed_float16"):
        trainer = _trainer(strategy, spec, model_config(
            "deepfm", top_mlp=(16,), batch_norm="sync"), OptimizerConfig(),
            64, precision=policy)
        result, losses = _train(trainer, in_order_dataset_fn(data, 64),
                                LoopConfig(steps=4, steps_per_closure=2,
                                           checkpoint_every=0))
        batch = {k: v[:8] for k, v in data.items()}
        run = {"losses": losses, "replicas": result.replicas,
               "logits_dtype": trainer.model(batch).dtype.name}
        if trainer.loss_scale is not None:
            run["loss_scale"] = float(trainer.loss_scale.scale.numpy())
        out["trained"][policy] = run
    return out


def _check_accumulation() -> dict:
    from psrec.features.spec.presets import criteo
    from psrec.models.optim.config import OptimizerConfig
    from psrec.models.ranking.config import model_config
    from psrec.ps_cluster.training.config import LoopConfig
    from tests._ps_helpers import in_order_dataset_fn
    from tests._ps_helpers import synthetic_rows
    spec = criteo(buckets=100, dim=4)
    data = synthetic_rows(spec, 1024, seed=5)
    model = model_config("deepfm", top_mlp=(16,))
    sgd = OptimizerConfig(sparse="sgd", dense="sgd", sparse_lr=0.5,
                          dense_lr=0.5, base_batch_size=128, warmup_steps=0)
    loop = LoopConfig(steps=3, steps_per_closure=3, checkpoint_every=0)
    _, strategy = _strategies()
    k = 4
    runs = {"accumulated": (32, k), "large": (128, 1), "unaccumulated": (32, 1)}
    weights, trained, out = None, {}, {"updates": {}}
    for name, (batch, steps) in runs.items():
        trainer = _trainer(strategy, spec, model, sgd, batch,
                           micro_batches=steps)
        if weights is None:
            weights = trainer.model.get_weights()
        trainer.model.set_weights(weights)
        run_loop = loop if name != "unaccumulated" else LoopConfig(
            steps=3 * k, steps_per_closure=3 * k, checkpoint_every=0)
        result, losses = _train(trainer, in_order_dataset_fn(data, batch),
                                run_loop)
        trained[name] = trainer.model.get_weights()
        if name != "unaccumulated":
            out[name] = losses
            out["updates"][name] = int(
                trainer.dense_optimizer.iterations.numpy())
        out["replicas"] = result.replicas

    def diff(a: str, b: str) -> float:
        return max(float(np.abs(x - y).max())
                   for x, y in zip(trained[a], trained[b]))
    out["weights_max_diff"] = diff("accumulated", "large")
    out["unaccumulated_max_diff"] = diff("unaccumulated", "large")
    return out


def _job_config(workdir: str, **loop):
    from psrec.data.input.config import InputConfig
    from psrec.features.spec.presets import criteo
    from psrec.launch.job.config import JobConfig
    from psrec.launch.job.config import StrategyConfig
    from psrec.launch.job.config import SyntheticData
    from psrec.models.ranking.config import model_config
    from psrec.ps_cluster.training.config import LoopConfig
    return JobConfig(
        workdir=Path(workdir), spec=criteo(buckets=100, dim=4),
        model_name="dcn", model=model_config("dcn", batch_norm="sync"),
        input=InputConfig(batch_size=64),
        loop=LoopConfig(**{"steps": 6, "steps_per_closure": 3,
                           "checkpoint_every": 3, "log_every": 3, **loop}),
        strategy=StrategyConfig(kind="mirrored", cpu_replicas=2,
                                mixed_precision=True, grad_accum_steps=2),
        synthetic=SyntheticData(rows=3000, shards=2, files=1))


def _scalar_steps(log_dir: Path) -> dict[str, list[int]]:
    import tensorflow as tf
    steps: dict[str, list[int]] = {}
    for path in sorted(log_dir.rglob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag.startswith("eval/"):
                    steps.setdefault(value.tag, []).append(int(event.step))
    return {tag: sorted(found) for tag, found in steps.items()}


def _check_job(workdir: str) -> dict:
    import contextlib
    import io

    from psrec.launch.job.run import run_job
    config = _job_config(workdir, eval_every=3)
    stream = io.StringIO()  # the progress reporter's stream (not a tty)
    with contextlib.redirect_stderr(stream):
        summary = run_job(config, log=lambda text: None)
    lines = stream.getvalue().splitlines()
    scalars = _scalar_steps(Path(workdir) / "tensorboard")
    resumed = run_job(dataclasses.replace(config, loop=dataclasses.replace(
        config.loop, steps=9, eval_every=0)), log=lambda text: None)
    return {**summary.to_dict(), "spec": config.spec.to_dict(),
            "eval_lines": [x for x in lines if ": eval:" in x],
            "checkpoint_lines": [x.split(":")[0] for x in lines
                                 if ": checkpoint " in x],
            "eval_scalars": scalars, "resumed": resumed.to_dict()}


def _check_stall(workdir: str) -> dict:
    """A job whose train call hangs: the watchdog must end the process."""
    import time

    from psrec.launch.job.run import run_job
    from psrec.ps_cluster.training import trainer as trainer_module
    original = trainer_module.make_train_function

    def hanging(*args, **kwargs):
        function = original(*args, **kwargs)

        def stalled_call(iterator):  # named in the watchdog's stack dump
            time.sleep(20 * _STALL_TIMEOUT)
            return function(iterator)
        return stalled_call

    trainer_module.make_train_function = hanging
    config = dataclasses.replace(_job_config(workdir), stall_timeout=_STALL_TIMEOUT,
                                 export=False)
    run_job(config, log=lambda text: None)
    print("NOT REACHED", flush=True)
    return {}


def _check_towers_and_attention() -> dict:
    import dataclasses
    import tempfile

    import pyarrow.parquet as pq

    from psrec.data.convert.convert import ConversionOptions
    from psrec.data.convert.convert import convert
    from psrec.data.ingest.synthetic import synthetic_table
    from psrec.models.optim.config import OptimizerConfig
    from psrec.ps_cluster.training.config import LoopConfig
    from tests import test_history as history
    from tests import test_multitask as multitask
    _, strategy = _strategies()
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        pq.write_table(history._log(400), root / "history.parquet",
                       row_group_size=64)
        towers_spec = multitask._spec()
        pq.write_table(synthetic_table(towers_spec, 400, seed=3),
                       root / "towers.parquet")
        runs = {"mmoe": (towers_spec, multitask.MMOE, "towers"),
                "attention": (history.BOTH_SPEC, dataclasses.replace(
                    history.MODELS["bst"], attention_mlp=(8,)), "history")}
        for name, (spec, model, data) in runs.items():
            report = convert([root / f"{data}.parquet"], spec, root / name,
                             ConversionOptions(shards=2, eval_fraction=0.25))
            trainer = _trainer(strategy, spec, model,
                               OptimizerConfig(dense_lr=0.01), 32)
            if name == "attention":
                watched = {key: layer.trainable_variables for key, layer in
                           trainer.model.sparse_arch.attention.items()}
            else:
                watched = {v.name: [v] for v in trainer.model.dense_variables()
                           if "gate" in v.name or "expert_" in v.name}
            before = {k: [v.numpy() for v in vs] for k, vs in watched.items()}
            result = trainer.train(
                trainer.dataset_fn(report.manifest),
                LoopConfig(steps=6, steps_per_closure=3, checkpoint_every=0),
                eval_manifest=report.manifest)
            out[name] = {
                "replicas": result.replicas, "step": result.step,
                "finite": bool(np.isfinite(result.final_loss)),
                "eval_count": result.eval.count,
                "eval_rows": report.rows_written["eval"],
                "tasks": [t["name"] for t in result.eval.tasks or ()],
                # the attention key's bias gets no gradient (softmax-free
                # scores shift evenly): not counted
                "moved": {k: bool(all(np.abs(v.numpy() - b).max() > 0
                                      for v, b in zip(vs, before[k])
                                      if "key/bias" not in v.name))
                          for k, vs in watched.items()}}
    return out


def _main(argv: list[str]) -> int:
    from psrec.runtime import configure_environment
    configure_environment()
    from psrec.ps_cluster.cluster.strategy import split_cpu
    split_cpu(2)
    checks = {"equivalence": _check_equivalence,
              "sync_batch_norm": _check_sync_batch_norm,
              "mixed_precision": _check_mixed_precision,
              "accumulation": _check_accumulation, "job": _check_job,
              "towers_and_attention": _check_towers_and_attention,
              "stall": _check_stall}
    if argv[0] != _MANY:
        print(json.dumps(checks[argv[0]](*argv[1:])), flush=True)
        return 0
    for name in argv[1:]:  # one line per check, in order
        try:
            record = {"result": checks[name]()}
        except Exception:  # reported; the next check still runs
            record = {"error": traceback.format_exc()}
        print(json.dumps({"check": name, **record}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
