"""Every location a URI: the string helpers keep ``scheme://`` intact
(pathlib turned ``gs://b/x`` into ``gs:/b/x``), Parquet is read from and
written to a real S3-compatible server on loopback (moto's server mode,
through pyarrow.fs and ``AWS_ENDPOINT_URL``), TFRecords, the manifest, the
run folder and checkpoints go to TensorFlow's in-memory ``ram://``
filesystem, and a scheme TensorFlow lacks is a one-line error.

The S3 round trip runs ``psrec ingest criteo`` (raw TSV on S3 -> Parquet on
S3), ``psrec convert`` (that Parquet folder -> ``ram://``) and two
``psrec train --strategy one-device --workdir ram://...`` runs, the second
resuming from the first's checkpoint, in this process (``ram://`` lives in
the process).
"""

import json
import socket
import uuid
from pathlib import Path

import pytest

from psrec.uri import join
from psrec.uri import name
from psrec.uri import parent
from psrec.uri_path import UriPath
from psrec.uri_path import as_path
from tests._shared import CRITEO_SAMPLE
from tests._shared import shared_data

ROWS = 3_000  # of the Criteo sample uploaded to S3: 15 steps of 256 rows


# -- the gs:/ mangling regression: helpers, UriPath, the run's folders --------


@pytest.mark.parametrize("base", ["gs://bucket/runs", "s3://bucket/runs/",
                                  "hdfs://namenode:8020/runs", "ram://runs"])
def test_uris_survive_join_parent_and_name(base):
    root = base.split("://")[0] + "://"
    child = join(base, "checkpoints", "ckpt-1.index")
    assert child.startswith(root) and "//" not in child[len(root):]
    assert child.endswith("/runs/checkpoints/ckpt-1.index")
    assert parent(parent(child)) == base.rstrip("/")
    assert name(child) == "ckpt-1.index"
    path = as_path(base) / "checkpoints" / "best" / "best-3.index"
    assert isinstance(path, UriPath)
    assert str(path) == join(base, "checkpoints/best/best-3.index")
    assert str(path.parent.parent) == join(base, "checkpoints")
    assert (path.name, path.suffix, path.stem) == ("best-3.index", ".index",
                                                   "best-3")
    assert str(path.with_name(".best-3.index.tmp-1")).startswith(root)


def test_a_bucket_root_is_its_own_parent_and_local_paths_stay_pathlib():
    assert parent("gs://bucket") == "gs://bucket"
    assert name("gs://bucket/") == "bucket"
    assert as_path("runs/x") == Path("runs/x")
    assert as_path("file:///tmp/x") == Path("/tmp/x")
    assert join("runs", "a", "b") == str(Path("runs", "a", "b"))
    assert parent("runs/a") == "runs" and name("runs/a/") == "a"


def test_job_config_and_run_state_keep_a_remote_workdir():
    from psrec.launch.job.config import JobConfig
    from psrec.launch.monitor.heartbeat import run_state_dir
    config = JobConfig(workdir=as_path("gs://bucket/runs/a"),
                       data=as_path("gs://bucket/data/"))
    assert str(config.checkpoint_dir) == "gs://bucket/runs/a/checkpoints"
    data = json.loads(json.dumps(config.to_dict()))
    assert (data["workdir"], data["data"]) == ("gs://bucket/runs/a",
                                               "gs://bucket/data")
    back = JobConfig.from_dict(data)
    assert str(back.workdir) == "gs://bucket/runs/a"
    assert str(back.checkpoint_dir) == "gs://bucket/runs/a/checkpoints"
    state = run_state_dir("gs://bucket/runs/a")  # heartbeat, logs: local
    assert isinstance(state, Path) and state.parts[-4:] == (
        "gs", "bucket", "runs", "a")
    assert run_state_dir("runs/a") == Path("runs/a")


# -- a scheme TensorFlow lacks ------------------------------------------------


def test_tensorflow_outputs_on_s3_are_a_one_line_error(tmp_path, capsys):
    from psrec.launch.cli.main import main
    # Refused before any input is read (this input is not even Parquet).
    code = main(["convert", str(shared_data(CRITEO_SAMPLE)), "--spec",
                 "criteo", "--out", "s3://bucket/tfrecord"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "s3://bucket/tfrecord" in err[0]
    assert "TensorFlow has no s3:// filesystem" in err[0]
    assert "gs://" in err[0] and "pyarrow" in err[0]
    from psrec.errors import ConfigError
    from psrec.ps_cluster.checkpoint.keeper import check_output_folder
    with pytest.raises(ConfigError, match="--workdir s3://bucket/run"):
        check_output_folder("s3://bucket/run/checkpoints", 1, "checkpoint")


# -- S3 on loopback (pyarrow) and ram:// (TensorFlow) -------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on loopback with bucket ``psrec``; the standard AWS
    variables point pyarrow (and boto3) at it."""
    import boto3
    from moto.server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(),
                                verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    with pytest.MonkeyPatch.context() as patch:
        for key, value in {"AWS_ACCESS_KEY_ID": "test",
                           "AWS_SECRET_ACCESS_KEY": "test",
                           "AWS_DEFAULT_REGION": "us-east-1",
                           "AWS_ENDPOINT_URL": f"http://{host}:{port}"
                           }.items():
            patch.setenv(key, value)
        client = boto3.client("s3")
        client.create_bucket(Bucket="psrec")
        head = b"".join(shared_data(CRITEO_SAMPLE).read_bytes().splitlines(
            True)[:ROWS])
        client.put_object(Bucket="psrec", Key="raw/day_0.txt", Body=head)
        try:
            yield client
        finally:
            server.stop()


def _keys(client, prefix: str) -> list[str]:
    """Object keys under ``prefix``, without the folder markers pyarrow
    writes (``parquet/``)."""
    found = client.list_objects_v2(Bucket="psrec", Prefix=prefix)
    return sorted(o["Key"] for o in found.get("Contents", [])
                  if not o["Key"].endswith("/"))


def test_parquet_folders_on_s3_are_listed_like_local_ones(s3, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from psrec.data.convert.inputs import parquet_files
    local = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": [1, 2, 3]}), local)
    for key in ("listing/b.parquet", "listing/sub/a.parquet",
                "listing/_tmp/c.parquet", "listing/.d.parquet",
                "listing/_SUCCESS"):
        s3.upload_file(str(local), "psrec", key)
    assert parquet_files(["s3://psrec/listing/"]) == [
        "s3://psrec/listing/b.parquet", "s3://psrec/listing/sub/a.parquet"]
    with pytest.raises(FileNotFoundError, match="s3://psrec/nothing.parquet"):
        parquet_files(["s3://psrec/nothing.parquet"])


def test_one_arrow_file_system_per_store_with_its_own_inner_paths(
        s3, monkeypatch):
    import psrec.uri as uri
    monkeypatch.setattr(uri, "_ARROW_STORES", {})
    built = []
    real = uri._arrow_from_uri
    monkeypatch.setattr(uri, "_arrow_from_uri",
                        lambda path: built.append(path) or real(path))
    paths = ["s3://psrec/raw/day_0.txt", "s3://psrec/a/b/", "s3://psrec",
             "s3://other/x.parquet"]
    found = [uri.arrow_filesystem(path) for path in paths]
    assert [inner for _, inner in found] == [
        "psrec/raw/day_0.txt", "psrec/a/b", "psrec", "other/x.parquet"]
    assert built == ["s3://psrec/raw/day_0.txt", "s3://other/x.parquet"]
    assert found[0][0] is found[2][0]
    assert found[0][0].get_file_info(found[0][1]).size > 0
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "another")
    uri.arrow_filesystem(paths[0])
    assert len(built) == 3  # other credentials: another client


def test_atomic_json_and_text_on_s3_through_pyarrow(s3):
    from psrec.data.format.files import write_json_atomic
    written = write_json_atomic("s3://psrec/run/summary.json", {"step": 3})
    assert isinstance(written, UriPath) and written.is_file()
    assert json.loads(written.read_text()) == {"step": 3}
    assert _keys(s3, "run/") == ["run/summary.json"]  # the temp one renamed
    with (written.parent / "notes.txt").open("w") as handle:
        handle.write("héllo\n")
    with (written.parent / "notes.txt").open("r") as handle:
        assert handle.read() == "héllo\n"
    assert [p.name for p in as_path("s3://psrec/run/").iterdir()] == [
        "notes.txt", "summary.json"]


def test_s3_parquet_to_ram_tfrecords_train_and_resume(s3, tmp_path, capsys):
    import tensorflow as tf

    from psrec.data.format.manifest import Manifest
    from psrec.features.spec.presets import criteo
    from psrec.launch.cli.main import main
    spec_file = criteo(buckets=200, dim=8).save(tmp_path / "spec.yaml")
    # ingest: raw TSV on S3 -> Parquet on S3 (temp object, then renamed).
    assert main(["ingest", "criteo", "s3://psrec/raw/day_0.txt", "--out",
                 "s3://psrec/parquet", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["files"] == ["s3://psrec/parquet/day_0.parquet"]
    assert report["rows"] == ROWS
    assert _keys(s3, "parquet/") == ["parquet/day_0.parquet"]
    # convert: the S3 Parquet folder -> TFRecords + manifest on ram://.
    root = f"ram://psrec-{uuid.uuid4().hex[:8]}"
    assert main(["convert", "s3://psrec/parquet", "--spec", str(spec_file),
                 "--out", f"{root}/data", "--shards", "2",
                 "--eval-fraction", "0.1", "--json"]) == 0
    converted = json.loads(capsys.readouterr().out)
    assert converted["manifest"] == f"{root}/data/manifest.json"
    assert converted["rows_read"] == ROWS
    names = tf.io.gfile.listdir(f"{root}/data")
    assert not [n for n in names if n.startswith(".")]  # no temp file left
    manifest = Manifest.load(f"{root}/data")
    assert str(manifest.root) == f"{root}/data"
    manifest.verify(checksums=True)  # sizes and sha256 read back from ram://
    assert manifest.files("train")[0].startswith(f"{root}/data/train-")
    assert manifest.sources[0]["file"] == "s3://psrec/parquet/day_0.parquet"
    # train on ram:// data into a ram:// workdir, then resume from it.
    run = f"{root}/run"
    train = ["train", "--strategy", "one-device", "--data", f"{root}/data",
             "--model", "dlrm", "--batch-size", "256",
             "--steps-per-closure", "5", "--checkpoint-every", "5",
             "--eval-every", "10", "--workdir", run, "--no-export", "--json"]
    assert main(train + ["--steps", "10"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["checkpoint"] == f"{run}/checkpoints/ckpt-10"
    assert first["tensorboard"] == f"{run}/tensorboard"
    assert tf.io.gfile.exists(f"{run}/checkpoints/ckpt-10.index")
    assert tf.io.gfile.exists(f"{run}/checkpoints/job.json")
    assert tf.io.gfile.listdir(f"{run}/tensorboard")
    assert json.loads(as_path(f"{run}/summary.json").read_text())[
        "step"] == 10
    assert main(train + ["--steps", "15"]) == 0
    captured = capsys.readouterr()
    second = json.loads(captured.out)
    assert (second["start_step"], second["step"]) == (10, 15)
    assert f"resumed from {run}/checkpoints/ckpt-10" in captured.err
    assert tf.train.latest_checkpoint(f"{run}/checkpoints") == (
        f"{run}/checkpoints/ckpt-15")
    assert (as_path(run) / "checkpoints" / "best.json").is_file()
    # TFRecords on s3:// (no TensorFlow filesystem): one line, exit 2,
    # before any model is built.
    for file in ("manifest.json", "spec.yaml"):
        s3.put_object(Bucket="psrec", Key=f"tfrecord/{file}",
                      Body=(as_path(f"{root}/data") / file).read_bytes())
    code = main(["train", "--strategy", "one-device", "--data",
                 "s3://psrec/tfrecord", "--workdir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "--data s3://psrec/tfrecord" in err[-1]
    assert "TensorFlow has no s3:// filesystem" in err[-1]
    tf.io.gfile.rmtree(root)


def test_parquet_on_ram_is_written_and_read_through_gfile():
    """``ram://`` is TensorFlow's alone: synthetic data (what ``psrec
    train`` generates into its workdir without --data) is written there
    through tf.io.gfile, then listed and read back as Parquet."""
    import tensorflow as tf

    from psrec.data.convert.inputs import parquet_batches
    from psrec.data.convert.inputs import parquet_files
    from psrec.data.convert.inputs import read_metadata
    from psrec.data.ingest.synthetic import write_synthetic_parquet
    from psrec.features.spec.presets import movielens
    root = f"ram://psrec-{uuid.uuid4().hex[:8]}"
    written = write_synthetic_parquet(movielens(), f"{root}/pq", 500,
                                      files=2)
    found = parquet_files([f"{root}/pq"])
    assert found == written and all(f.startswith(root) for f in found)
    assert sum(read_metadata(f).num_rows for f in found) == 500
    assert sum(b.num_rows for b in parquet_batches(found[0])) == 250
    assert not [n for n in tf.io.gfile.listdir(f"{root}/pq")
                if n.startswith(".")]
    tf.io.gfile.rmtree(root)


def test_movielens_on_s3_ingests_and_converts_with_its_catalogue_to_ram(
        s3, capsys):
    """The MovieLens folder may be a URI too, and the retrieval catalogue
    (``candidates.parquet``, written beside the TFRecords) goes through
    gfile to a store pyarrow cannot reach (``ram://``)."""
    import tensorflow as tf

    from psrec.data.convert.catalogue import Catalogue
    from psrec.data.format.manifest import Manifest
    from psrec.features.spec.presets import resolve_spec
    from psrec.launch.cli.main import main
    from tests._shared import MOVIELENS_DIR
    for part in ("u.data", "u.item", "u.genre", "u.user"):
        s3.upload_file(str(shared_data(MOVIELENS_DIR) / part), "psrec",
                       f"ml-100k/{part}")
    assert main(["ingest", "movielens", "s3://psrec/ml-100k/", "--out",
                 "s3://psrec/ml-parquet", "--no-progress"]) == 0
    assert _keys(s3, "ml-parquet/") == ["ml-parquet/movielens.parquet"]
    root = f"ram://psrec-{uuid.uuid4().hex[:8]}/retrieval"
    assert main(["convert", "s3://psrec/ml-parquet", "--spec",
                 "movielens-retrieval", "--split", "hash", "--eval-fraction",
                 "0.2", "--out", root, "--no-progress"]) == 0
    capsys.readouterr()
    manifest = Manifest.load(root)
    assert manifest.rows("train") + manifest.rows("eval") == 100_000
    catalogue = Catalogue.load(root, resolve_spec("movielens-retrieval"))
    assert catalogue.size == 1682  # every movie rated in ml-100k
    assert int(catalogue.train_counts.sum()) == manifest.rows("train")
    tf.io.gfile.rmtree(root.rsplit("/", 1)[0])
