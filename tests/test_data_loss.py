"""No silent data loss (issue 10 §4): corruption counted in rows, values
that overflow float32 are bad rows, a non-finite loss stops training,
corrupted Parquet inputs are one-line errors, checkpoint folders are
checked before servers start and a failed save leaves no ``*_temp``."""

import dataclasses
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.format.manifest import Manifest
from psrec.data.format.manifest import ManifestError
from psrec.data.ingest.synthetic import write_synthetic_parquet
from psrec.data.input.integrity import repair_corrupted_shards
from psrec.features import criteo
from psrec.features.spec.spec import DENSE_COLUMN
from tests._ps_helpers import read_split

SPEC = criteo(buckets=100, dim=4)


@pytest.fixture(scope="module")
def parquet(tmp_path_factory):
    root = tmp_path_factory.mktemp("loss")
    return write_synthetic_parquet(SPEC, root / "pq", 3000, files=1)[0]


@pytest.fixture(scope="module")
def manifest(parquet, tmp_path_factory):
    return convert([parquet], SPEC, tmp_path_factory.mktemp("tfr") / "tfr",
                   ConversionOptions(shards=2, eval_fraction=0.2,
                                     block_rows=64)).manifest


def _copy(manifest, dst):
    shutil.copytree(manifest.root, dst)
    return Manifest.load(dst)


def _rows_before(path, cut: int) -> int:
    """Rows of the records of ``path`` that end at or before byte ``cut``
    (read from the intact file)."""
    rows, offset = 0, 0
    for record in tf.data.TFRecordDataset(str(path)):
        offset += len(record.numpy()) + 16
        if offset > cut:
            break
        example = tf.train.Example.FromString(record.numpy())
        rows += example.features.feature["__rows__"].int64_list.value[0]
    return rows


# -- corruption is counted in rows ----------------------------------------------


def test_truncated_shard_counts_every_row_after_the_cut(manifest, tmp_path):
    copy = _copy(manifest, tmp_path / "tfr")
    shard = copy.shards["train"][0]
    path = copy.root / shard.file
    cut = int(path.stat().st_size * 0.46)
    expected_lost = shard.rows - _rows_before(manifest.root / shard.file, cut)
    path.write_bytes(path.read_bytes()[:cut])
    assert expected_lost > 64  # many records, not "1 corrupted record"
    with pytest.raises(ManifestError) as refused:
        repair_corrupted_shards(copy, tmp_path / "rep", 1)
    message = str(refused.value)
    records = -(-expected_lost // copy.block_rows)
    assert f"{records} corrupted record(s) found, above " \
        "--max-corrupt-records 1" in message
    assert (f"{expected_lost} of {copy.rows('train')} train rows"
            in message)
    assert str(path) in message and f"{expected_lost} of {shard.rows} rows" \
        in message
    fixed, report = repair_corrupted_shards(copy, tmp_path / "rep", records)
    assert report.skipped == records
    assert report.rows_lost("train") == expected_lost
    assert f"{expected_lost} of {shard.rows} rows lost" in report.summary()
    kept = read_split(fixed, SPEC, "train")
    assert len(kept[SPEC.label.name]) == copy.rows("train") - expected_lost


def test_flipped_record_loses_its_block_of_rows(manifest, tmp_path):
    copy = _copy(manifest, tmp_path / "tfr")
    shard = copy.shards["train"][1]
    path = copy.root / shard.file
    data = bytearray(path.read_bytes())
    data[12 + 40] ^= 1  # the data of the first record
    path.write_bytes(bytes(data))
    _, report = repair_corrupted_shards(copy, tmp_path / "rep", 1)
    assert report.skipped == 1
    assert report.rows_lost() == copy.block_rows
    assert report.to_dict()["files"][str(path)]["rows_lost"] == 64


# -- values that overflow float32 are bad rows ----------------------------------


def _with_dense(parquet, tmp_path, rows: list[int], column: str,
                value: float):
    table = pq.read_table(parquet)
    original = table.column(column)
    nulls = original.is_null().to_numpy(zero_copy_only=False)
    values = original.to_numpy(zero_copy_only=False).astype(np.float64)
    values[rows], nulls[rows] = value, False
    table = table.set_column(table.schema.get_field_index(column), column,
                             pa.array(values, pa.float64(), mask=nulls))
    out = tmp_path / "in.parquet"
    pq.write_table(table, out)
    return out


def test_dense_value_overflowing_float32_is_a_bad_row(parquet, tmp_path):
    column = SPEC.dense[0].name
    bad = _with_dense(parquet, tmp_path, [5, 17, 900], column, 1e300)
    report = convert([bad], SPEC, tmp_path / "out", ConversionOptions(
        shards=1, max_bad_fraction=0.01))
    assert report.bad_rows == 3
    assert report.bad_reasons == {
        f"value in {column!r} overflows float32": 3}
    written = read_split(report.manifest, SPEC, "train")
    assert np.isfinite(written[DENSE_COLUMN]).all()
    quarantined = pq.read_table(report.quarantine).column("row").to_pylist()
    assert sorted(quarantined) == [5, 17, 900]


def test_label_overflowing_float32_is_a_bad_row(parquet, tmp_path):
    spec = dataclasses.replace(SPEC, label=dataclasses.replace(
        SPEC.label, threshold=0.5))
    bad = _with_dense(parquet, tmp_path, [3], spec.label.name, -1e39)
    report = convert([bad], spec, tmp_path / "out", ConversionOptions(
        shards=1, max_bad_fraction=0.01))
    assert report.bad_reasons == {
        f"label {spec.label.name!r} overflows float32": 1}


# -- a non-finite loss stops training ---------------------------------------------

BATCH = 16


def _non_finite_data(rows_ok: int, rows: int):
    from tests._ps_helpers import synthetic_rows
    data = synthetic_rows(SPEC, rows, seed=5)
    data[DENSE_COLUMN][rows_ok:] = np.inf  # every later batch is poisoned
    return data


def _weights_and_slots(trainer) -> list[np.ndarray]:
    values = []
    for var in trainer.model.embedding_variables() + \
            trainer.model.dense_variables():
        values.append(np.array(var.numpy()))
    for optimizer in (trainer.sparse_optimizer, trainer.dense_optimizer):
        values += [np.array(v.numpy()) for v in optimizer.variables()]
    return values


def test_non_finite_loss_stops_before_applying_the_step(tmp_path):
    from psrec.data.input.config import InputConfig
    from psrec.models.optim.config import OptimizerConfig
    from psrec.models.ranking.config import ModelConfig
    from psrec.ps_cluster.training.config import LoopConfig
    from psrec.ps_cluster.training.step import NonFiniteLossError
    from psrec.ps_cluster.training.trainer import Trainer
    from tests._ps_helpers import in_order_dataset_fn
    trainer = Trainer(tf.distribute.get_strategy(), SPEC,
                      ModelConfig(interaction="cross", top_mlp=(8,),
                                  cross_layers=1),
                      OptimizerConfig(base_batch_size=BATCH, warmup_steps=0),
                      InputConfig(batch_size=BATCH),
                      checkpoint_dir=tmp_path / "ckpt")
    snapshots = {}

    def on_progress(step, loss, count):
        assert np.isfinite(loss)
        snapshots[step] = _weights_and_slots(trainer)

    # Steps 1-4 are finite, step 5 (the first of the third call) is not.
    dataset_fn = in_order_dataset_fn(_non_finite_data(4 * BATCH, 10 * BATCH),
                                     BATCH)
    with pytest.raises(NonFiniteLossError, match=r"^step 5: the loss or a "
                       r"gradient is not finite") as stopped:
        trainer.train(dataset_fn, LoopConfig(
            steps=10, steps_per_closure=2, checkpoint_every=2, eval_every=0,
            keep_best="none"), on_progress=on_progress)
    assert stopped.value.step == 5 and sorted(snapshots) == [2, 4]
    after = _weights_and_slots(trainer)
    assert all(np.isfinite(v).all() for v in after)
    assert all(np.array_equal(a, b) for a, b in zip(after, snapshots[4]))
    assert trainer.executed_steps == 4
    assert trainer.keeper.latest.endswith("ckpt-4")
    named = stopped.value.with_checkpoint(trainer.keeper.latest)
    assert f"The last good checkpoint is {trainer.keeper.latest}:" \
        in str(named)
    assert named.exit_code == 2


@pytest.mark.cluster
def test_non_finite_loss_stops_the_ps_closures(ps_cluster, tmp_path):
    """The same check inside closures scheduled on PS workers: the
    coordinator stops on the flag and no worker applied a NaN update."""
    from psrec.data.input.config import InputConfig
    from psrec.models.optim.config import OptimizerConfig
    from psrec.models.ranking.config import ModelConfig
    from psrec.ps_cluster.cluster.partition_config import PartitionConfig
    from psrec.ps_cluster.cluster.strategy import build_ps_strategy
    from psrec.ps_cluster.training.config import LoopConfig
    from psrec.ps_cluster.training.step import NonFiniteLossError
    from psrec.ps_cluster.training.trainer import Trainer
    from tests._ps_helpers import in_order_dataset_fn
    trainer = Trainer(build_ps_strategy(ps_cluster,
                                        PartitionConfig(kind="fixed")),
                      SPEC, ModelConfig(interaction="cross", top_mlp=(8,),
                                        cross_layers=1),
                      OptimizerConfig(base_batch_size=BATCH, warmup_steps=0),
                      InputConfig(batch_size=BATCH),
                      checkpoint_dir=tmp_path / "ckpt")
    # Each worker reads the rows in order: its first 2 steps are finite.
    dataset_fn = in_order_dataset_fn(_non_finite_data(2 * BATCH, 10 * BATCH),
                                     BATCH)
    with pytest.raises(NonFiniteLossError) as stopped:
        trainer.train(dataset_fn, LoopConfig(
            steps=12, steps_per_closure=2, checkpoint_every=2, eval_every=0,
            keep_best="none"))
    assert stopped.value.step > 2
    assert all(np.isfinite(v).all() for v in _weights_and_slots(trainer))
    assert trainer.executed_steps < 12
    assert trainer.keeper.latest is not None


# -- truncated or corrupted Parquet inputs ------------------------------------------


def _convert_cli(source, out, capsys) -> tuple[int, str]:
    from psrec.launch.cli.main import main
    code = main(["convert", str(source), "--spec", "criteo", "--out",
                 str(out)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    messages = [line for line in err.splitlines() if line.startswith("psrec")]
    assert len(messages) == 1, err  # one line (besides the progress bar)
    return code, messages[0]


def test_truncated_parquet_is_a_one_line_error_naming_it(parquet, tmp_path,
                                                          capsys):
    cut = tmp_path / "cut.parquet"
    with open(parquet, "rb") as file:
        data = file.read()
    cut.write_bytes(data[:int(len(data) * 0.46)])
    code, err = _convert_cli(cut, tmp_path / "out", capsys)
    assert code == 1
    assert f"Parquet file {cut} is truncated or corrupted" in err
    assert "psrec ingest" not in err  # it is Parquet, only damaged
    assert not (tmp_path / "out").exists()


def test_corrupted_parquet_page_is_a_one_line_error_naming_it(tmp_path,
                                                              capsys):
    from psrec.data.ingest.synthetic import synthetic_table
    table = synthetic_table(criteo(), 3000)
    path = tmp_path / "in.parquet"
    pq.write_table(table, path, write_page_checksum=True,
                   row_group_size=1000)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x5A  # inside a data page of a later row group
    path.write_bytes(bytes(data))
    code, err = _convert_cli(path, tmp_path / "out", capsys)
    assert code == 1, err
    assert f"Parquet file {path} is truncated or corrupted" in err
    assert not (tmp_path / "out").exists()


def test_spec_infer_names_a_corrupted_parquet_page(tmp_path, capsys):
    from psrec.data.ingest.synthetic import synthetic_table
    from psrec.launch.cli.main import main
    path = tmp_path / "in.parquet"
    pq.write_table(synthetic_table(criteo(), 3000), path,
                   write_page_checksum=True, row_group_size=1000)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x5A
    path.write_bytes(bytes(data))
    code = main(["spec", "infer", str(path), "--label", "label", "--out",
                 str(tmp_path / "spec.yaml"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert f"Parquet file {path} is truncated or corrupted" in err
    assert not (tmp_path / "spec.yaml").exists()


# -- checkpoint and export folders ------------------------------------------------


def _keeper(directory):
    from psrec.ps_cluster.checkpoint.keeper import CheckpointKeeper
    variable = tf.Variable(tf.ones([1000, 8]))
    return CheckpointKeeper(directory, tf.train.Checkpoint(v=variable))


def test_failed_save_leaves_no_temp_and_keeps_the_last_checkpoint(tmp_path):
    from psrec.ps_cluster.checkpoint.keeper import SaveError
    keeper = _keeper(tmp_path / "ckpt")
    first = keeper.save(1)
    # The save of step 2 writes ckpt-2_temp/ and then fails to merge it
    # into ckpt-2.index, which is taken by a folder.
    (tmp_path / "ckpt" / "ckpt-2.index").mkdir()
    with pytest.raises(SaveError, match=r"saving checkpoint 2 in .* failed"
                       r".*ckpt-2_temp"):
        keeper.save(2)
    assert not list((tmp_path / "ckpt").glob("*_temp*"))
    assert keeper.latest == first
    assert tf.train.load_checkpoint(first) is not None


def test_a_save_the_folder_refuses_names_the_os_cause_and_folder(tmp_path):
    """The save's own write fails at the OS (tests may run as root, which
    chmod does not stop: the save's ``ckpt-2_temp`` is taken by a regular
    file, so creating a file inside it fails with ENOTDIR -- the same path
    through TensorFlow's file system as EROFS or ENOSPC)."""
    from psrec.ps_cluster.checkpoint.keeper import SaveError
    folder = tmp_path / "ckpt"
    keeper = _keeper(folder)
    first = keeper.save(1)
    (folder / "ckpt-2_temp").write_text("not a folder")
    with pytest.raises(SaveError) as failed:
        keeper.save(2)
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(f"saving checkpoint 2 in {folder} failed: "
                              "Not a directory (ENOTDIR); "), message
    assert "function_node" not in message and "[Op:" not in message
    assert failed.value.exit_code == 1
    assert not list(folder.glob("*_temp*")) and keeper.latest == first


def test_the_os_cause_is_found_in_a_flattened_cluster_stack():
    from psrec.errors import os_error_cause
    stack = ("Graph execution error: " + "Detected at node x defined at "
             "(most recent call last): File a.py, line 1 " * 40
             + "/w/ckpt/ckpt-8_temp/part-00001-of-00002.data; Read-only "
             "file system [[{{node SaveV2}}]] [Op:__inference_save_fn_93]")
    assert len(stack) > 600
    error = tf.errors.PermissionDeniedError(None, None, stack)
    assert os_error_cause(error) == "Read-only file system (EROFS)"
    assert os_error_cause(OSError(28, "x")) == (
        "No space left on device (ENOSPC)")
    assert os_error_cause(ValueError("a shape mismatch")) is None


def test_partial_save_of_a_killed_run_is_removed_at_start(tmp_path):
    keeper = _keeper(tmp_path / "ckpt")
    keeper.save(1)
    partial = tmp_path / "ckpt" / "ckpt-2_temp"
    partial.mkdir()
    (partial / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"x")
    restarted = _keeper(tmp_path / "ckpt")
    assert not partial.exists()
    assert restarted.latest.endswith("ckpt-1")


def test_checkpoint_folder_without_room_is_refused_before_servers(tmp_path):
    from psrec.launch.job.config import JobConfig
    from psrec.launch.job.data import check_output_folders
    from psrec.launch.job.data import prepare_data
    from psrec.ps_cluster.checkpoint.keeper import OutputFolderError
    # Tables of 26 x 10^10 rows x 64 floats: more than any disk here.
    config = JobConfig(spec=criteo(buckets=10**10, dim=64),
                       workdir=str(tmp_path / "work"))
    with pytest.raises(OutputFolderError) as refused:
        prepare_data(config)  # the first check of a job, before any server
    assert refused.value.exit_code == 2
    message = str(refused.value)
    assert f"the checkpoint folder {config.checkpoint_dir} has " in message
    assert "MiB free, one checkpoint needs about" in message
    assert not (tmp_path / "work").exists()  # no data was generated
    small = JobConfig(spec=criteo(buckets=100, dim=4),
                      workdir=str(tmp_path / "work"))
    check_output_folders(small)


def test_unwritable_checkpoint_folder_is_refused(tmp_path):
    from psrec.launch.job.config import JobConfig
    from psrec.launch.job.data import check_output_folders
    from psrec.ps_cluster.checkpoint.keeper import OutputFolderError
    (tmp_path / "file").write_text("not a folder")
    config = JobConfig(spec=criteo(buckets=100, dim=4),
                       workdir=str(tmp_path / "file" / "work"))
    with pytest.raises(OutputFolderError, match=r"checkpoint folder .* is "
                       r"not writable"):
        check_output_folders(config)
