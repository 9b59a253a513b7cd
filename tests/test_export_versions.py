"""Serving hand-off: ``psrec export`` writes ``OUT/<version>/`` as TF
Serving expects (numbered, atomic, never overwritten), each version with
``assets.extra/tf_serving_warmup_requests`` built from the run's raw eval
rows, and ``psrec predict`` scores with the highest version of a root."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.ingest.synthetic import synthetic_table
from psrec.launch.cli.main import main
from psrec.launch.job.config import JobConfig
from psrec.launch.job.export import export_checkpoint
from psrec.models.build import build_model
from psrec.models.ranking.config import ModelConfig
from psrec.models.serving.scoring import score_files
from psrec.models.serving.versions import resolve
from psrec.models.serving.warmup import WARMUP_FILE
from psrec.models.serving.warmup import read_warmup
from psrec.models.serving.warmup import warmup_rows
from psrec.ps_cluster.checkpoint.keeper import CheckpointKeeper
from tests._client import client_inputs
from tests._client import mixed_spec
from tests._ps_helpers import read_split
from tests._warmup import official_requests
from tests._warmup import serve
from tests.test_progress import Recorder

SPEC = mixed_spec("versions")
MODEL = ModelConfig(interaction="dot", bottom_mlp=(8,), top_mlp=(8,))
ROWS = (20, 200)  # two raw files, row groups of 8 rows


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A checkpoint (untrained model, with the job.json naming its data),
    the converted data (hash split: eval rows in both raw files) and the
    raw Parquet files."""
    root = tmp_path_factory.mktemp("versions")
    files = []
    for i, rows in enumerate(ROWS):
        files.append(root / "raw" / f"part-{i}.parquet")
        files[-1].parent.mkdir(exist_ok=True)
        pq.write_table(synthetic_table(SPEC, rows, seed=i), files[-1],
                       row_group_size=8)
    manifest = convert(files, SPEC, root / "data", ConversionOptions(
        shards=1, eval_fraction=0.3, split_mode="hash",
        block_rows=16)).manifest
    model = build_model(SPEC, MODEL)
    checkpoints = root / "checkpoints"
    CheckpointKeeper(checkpoints, tf.train.Checkpoint(model=model)).save(1)
    JobConfig(workdir=root, spec=SPEC, model_name="dlrm", model=MODEL,
              data=manifest.root).write(checkpoints)
    return checkpoints, manifest, files


@pytest.fixture(scope="module")
def versions_3_and_5(run, tmp_path_factory):
    """An export folder with versions 3 and 5 (``psrec export --version``)."""
    checkpoints, _, _ = run
    out = tmp_path_factory.mktemp("exports") / "export"
    for version in ("3", "5"):
        assert main(["export", str(checkpoints), "--out", str(out),
                     "--version", version]) == 0
    return out


def _export(capsys, checkpoints, out, *extra) -> tuple[int, str, str]:
    code = main(["export", str(checkpoints), "--out", str(out), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_exports_are_numbered_versions_never_overwritten(run, tmp_path,
                                                         capsys):
    checkpoints, _, _ = run
    out = tmp_path / "export"
    for version in (1, 2):
        code, stdout, _ = _export(capsys, checkpoints, out, "--json")
        assert code == 0
        report = json.loads(stdout)
        assert report["version"] == version
        assert report["saved_model"] == str(out / str(version))
        assert (out / str(version) / "saved_model.pb").is_file()
        assert (out / str(version) / WARMUP_FILE).is_file()
    assert sorted(p.name for p in out.iterdir()) == ["1", "2"]  # no temp

    before = (out / "1" / "saved_model.pb").stat().st_mtime_ns
    code, stdout, stderr = _export(capsys, checkpoints, out, "--version", "1")
    assert code == 2 and stdout == ""
    assert len(stderr.strip().splitlines()) == 1
    assert f"{out / '1'} exists" in stderr and "never overwritten" in stderr
    assert (out / "1" / "saved_model.pb").stat().st_mtime_ns == before

    # A version folder (an unversioned SavedModel) is no export folder.
    code, _, stderr = _export(capsys, checkpoints, out / "2")
    assert code == 2 and "holds an unversioned SavedModel" in stderr
    (out / "6").mkdir()  # a version folder, even incomplete, is taken
    code, stdout, _ = _export(capsys, checkpoints, out)
    assert code == 0 and stdout.startswith(f"{out / '7'} (version 7)")
    assert sorted(int(p.name) for p in out.iterdir()) == [1, 2, 6, 7]


def test_a_failed_export_leaves_no_version(run, tmp_path, monkeypatch):
    """The SavedModel write dies after writing part of the model: neither
    a version folder nor the temporary folder remains."""
    import psrec.launch.job.export as exporting
    checkpoints, _, _ = run
    out = tmp_path / "export"
    (out / "1").mkdir(parents=True)
    real = exporting.export_saved_model

    def dies_half_way(model, spec, folder, **kwargs):
        real(model, spec, folder, **kwargs)
        tf.io.gfile.remove(f"{folder}/saved_model.pb")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(exporting, "export_saved_model", dies_half_way)
    with pytest.raises(OSError, match="No space left"):
        export_checkpoint(checkpoints, out)
    assert [p.name for p in out.iterdir()] == ["1"]


def test_warmup_requests_are_the_raw_eval_rows_and_serve(run,
                                                         versions_3_and_5):
    _, manifest, files = run
    version = versions_3_and_5 / "3"
    info = json.loads((version / "psrec_export.json").read_text())
    requests = read_warmup(str(version))
    assert [len(r["city"]) for r in requests] == [1, 8]
    # The first eval examples, traced back to their raw rows independently
    # of psrec (ids are positions over the raw files).
    ids = np.sort(read_split(manifest, SPEC, "eval")["psrec__id"][:8])
    raw = pa.concat_tables([pq.read_table(f) for f in files]).take(ids)
    expected = client_inputs(raw, SPEC)
    assert ids.max() >= ROWS[0]  # rows of the second file too
    for name, values in expected.items():
        got = requests[1][name]
        if got.dtype == object:
            got = got.astype(str)
        np.testing.assert_array_equal(got, values.astype(got.dtype))
        np.testing.assert_array_equal(requests[0][name], requests[1][name][:1])
    assert info["warmup"].startswith(
        f"eval rows {', '.join(map(str, ids))} of {manifest.root}")

    signature = tf.saved_model.load(str(version)).signatures[
        "serving_default"]
    for request in requests:
        outputs = signature(**{k: tf.constant(v) for k, v in request.items()})
        probability = outputs["probability"].numpy()
        assert probability.shape == (len(request["city"]),)
        assert np.all(np.isfinite(probability))
        assert np.all(np.isfinite(outputs["logit"].numpy()))


def _fields(data: bytes) -> list[tuple[int, int, bytes | int]]:
    """``(field number, wire type, value)`` of a serialized message, read
    by the protobuf wire format rules (no schema)."""
    def varint(i):
        value, shift = 0, 0
        while True:
            value |= (data[i] & 0x7F) << shift
            shift += 7
            i += 1
            if not data[i - 1] & 0x80:
                return value, i
    out, i = [], 0
    while i < len(data):
        key, i = varint(i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(i)
        elif wire == 2:
            size, i = varint(i)
            value, i = data[i:i + size], i + size
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        out.append((number, wire, value))
    return out


def test_warmup_records_use_the_tf_serving_field_numbers(versions_3_and_5):
    """Field numbers of tensorflow/serving's tensorflow_serving/apis/
    prediction_log.proto (PredictionLog.predict_log = 6, PredictLog.request
    = 1), predict.proto (PredictRequest.model_spec = 1, inputs = 2, a map
    whose entries are key = 1, value = 2) and model.proto (ModelSpec.name =
    1, signature_name = 3)."""
    records = list(tf.data.TFRecordDataset(
        str(versions_3_and_5 / "5" / WARMUP_FILE)).as_numpy_iterator())
    assert len(records) == 2
    (number, wire, log), = _fields(records[0])
    assert (number, wire) == (6, 2)
    (number, wire, request), = _fields(log)
    assert (number, wire) == (1, 2)
    parts = _fields(request)
    model_spec = dict((n, v) for n, _, v in _fields(
        next(v for n, _, v in parts if n == 1)))
    assert model_spec == {1: b"export", 3: b"serving_default"}
    inputs = {}
    for entry in (v for n, _, v in parts if n == 2):
        entry = dict((n, v) for n, _, v in _fields(entry))
        tensor = type(tf.make_tensor_proto(0.0)).FromString(entry[2])
        inputs[entry[1].decode()] = tf.make_ndarray(tensor)
    assert sorted(inputs) == sorted(SPEC.raw_inputs)
    assert {n for n, _, _ in parts} == {1, 2}


def test_warmup_parses_with_tf_serving_protos_and_feeds_the_signature(
        versions_3_and_5):
    """TF Serving's own PredictionLog class reads every record: a Predict
    request to ``serving_default`` of the model named like the export
    folder, whose inputs are the signature's (names, dtypes, ranks), the
    rows psrec's reader returns; the signature runs on them."""
    version = versions_3_and_5 / "5"
    requests = official_requests(version, "export")
    assert [len(r["city"]) for r in requests] == [1, 8]
    assert sorted(requests[0]) == sorted(SPEC.raw_inputs)
    for official, psrec_read in zip(requests, read_warmup(str(version)),
                                    strict=True):
        for name, values in official.items():
            np.testing.assert_array_equal(values, psrec_read[name])
        outputs = serve(version, official)
        assert outputs["probability"].shape == (len(official["city"]),)
        assert np.all(np.isfinite(outputs["logit"]))


def test_predict_uses_the_highest_version_and_says_so(run, versions_3_and_5,
                                                     tmp_path, capsys):
    _, _, files = run
    out = versions_3_and_5
    (out / "9").mkdir(exist_ok=True)  # incomplete (no saved_model.pb): skipped
    scores = tmp_path / "scores.parquet"
    assert main(["predict", "--model", str(out), "--data", *map(str, files),
                 "--out", str(scores), "--batch-rows", "50", "--keep",
                 "city", "--no-progress", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == str(out / "5") and report["version"] == 5
    table = pq.read_table(scores)
    assert table.num_rows == sum(ROWS)
    assert table.column_names == ["row", "label", "city", "probability",
                                  "logit"]
    assert main(["predict", "--model", str(out / "3"), "--data", str(files[0]),
                 "--out", str(scores), "--no-progress"]) == 0
    assert capsys.readouterr().out.startswith(f"model {out / '3'}\n")
    assert main(["score", str(out), str(files[0]), "--out", str(scores)]) == 0
    assert (f"model {out / '5'} (version 5, the highest of {out})"
            in capsys.readouterr().out)
    # The progress line names the command typed.
    assert main(["predict", "--model", str(out), "--data", str(files[0]),
                 "--out", str(scores)]) == 0
    err = capsys.readouterr().err
    assert "predict (rows)" in err and "score (rows)" not in err
    # Progress: the rows of every batch, against the inputs' total.
    recorder = Recorder()
    score_files(out, files, scores, batch_rows=64, progress=recorder)
    (task,) = recorder.tasks
    assert (task.label, task.total, task.done) == ("score", sum(ROWS),
                                                    sum(ROWS))
    assert max(task.advances) <= 64 and task.closed


def test_export_to_a_uri_and_synthetic_warmup_without_data(run):
    """Exports go through tf.io.gfile (here TensorFlow's in-memory
    filesystem, which has no folder rename); without readable data the
    warmup rows are synthetic."""
    checkpoints, _, _ = run
    root = "ram://psrec-versions/export"
    tf.io.gfile.makedirs(f"{root}/1")  # incomplete: taken, never resolved
    second = export_checkpoint(checkpoints, root)
    assert second.path == f"{root}/2"
    assert sorted(n.rstrip("/") for n in tf.io.gfile.listdir(root)) == [
        "1", "2"]
    assert tf.io.gfile.exists(f"{root}/2/saved_model.pb")
    assert resolve(root).path == f"{root}/2"
    assert len(read_warmup(second.path)) == 2
    loaded = tf.saved_model.load(second.path)
    assert "serving_default" in loaded.signatures
    synthetic = warmup_rows(SPEC, None)
    assert synthetic.source.startswith("synthetic rows")
    assert sorted(synthetic.inputs) == sorted(SPEC.raw_inputs)
