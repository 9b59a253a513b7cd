"""Tests of the data side of the ``psrec`` CLI, called in-process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from psrec.data.format.manifest import MANIFEST_NAME
from psrec.data.format.manifest import Manifest
from psrec.data.ingest.synthetic import synthetic_table
from psrec.data.ingest.synthetic import write_synthetic_parquet
from psrec.features import FeatureSpec
from psrec.features import criteo
from psrec.features import movielens
from psrec.launch.cli.main import main

SPEC = criteo(buckets=1000)


def _spec_file(tmp_path: Path) -> str:
    return str(SPEC.save(tmp_path / "criteo-1000.yaml"))


def test_help_lists_the_data_and_cluster_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("ingest", "convert", "audit-shards", "tf-config", "spec",
                    "synth"):
        assert command in out, command


def test_convert_help_shows_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--spec", "--shards", "--eval-fraction", "--block-rows",
                   "--max-bad-fraction"):
        assert option in out


@pytest.mark.parametrize("preset, build", [("criteo", criteo),
                                           ("movielens", movielens)])
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_spec_command_writes_a_loadable_preset(tmp_path, capsys, preset,
                                               build, suffix):
    out = tmp_path / f"x{suffix}"
    assert main(["spec", preset, "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    loaded = FeatureSpec.load(out)
    assert loaded == build()
    assert loaded.fingerprint() == build().fingerprint()


def test_spec_command_prints_yaml_and_rejects_unknown_spec(capsys):
    assert main(["spec", "criteo"]) == 0
    out = capsys.readouterr().out
    assert "name: criteo" in out and "C26" in out
    assert main(["spec", "no-such-preset"]) == 2
    err = capsys.readouterr().err
    assert "no-such-preset" in err and "criteo" in err and "movielens" in err


def test_convert_with_missing_column_exits_1_naming_file_and_column(
        tmp_path, capsys):
    path = tmp_path / "no_c3.parquet"
    pq.write_table(synthetic_table(SPEC, 200).drop_columns(["C3"]), path)
    code = main(["convert", str(path), "--spec", _spec_file(tmp_path),
                 "--out", str(tmp_path / "out")])
    assert code == 1  # the input does not hold what the spec reads: bad data
    err = capsys.readouterr().err
    assert str(path) in err and "'C3'" in err
    assert not (tmp_path / "out").exists()


def test_convert_with_missing_input_file_exits_2(tmp_path, capsys):
    missing = tmp_path / "nope.parquet"
    code = main(["convert", str(missing), "--spec", "criteo", "--out",
                 str(tmp_path / "out")])
    assert code == 2
    assert str(missing) in capsys.readouterr().err


def test_convert_with_too_many_bad_rows_exits_1(tmp_path, capsys):
    table = synthetic_table(SPEC, 2000)
    label = table.column("label").to_numpy().copy()
    label[::100] = 2  # 1% bad rows > default --max-bad-fraction 0.001
    table = table.set_column(0, "label", pa.array(label))
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path)
    out = tmp_path / "out"
    args = ["convert", str(path), "--spec", _spec_file(tmp_path), "--out",
            str(out), "--shards", "2", "--eval-fraction", "0"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "20 of 2000 rows" in err and "label 'label' = 2 is not 0/1" in err
    assert not (out / MANIFEST_NAME).exists()
    assert not list(out.glob("*.tfrecord*"))
    # Raising the limit lets the same data through, minus the bad rows.
    assert main(args + ["--max-bad-fraction", "0.02"]) == 0
    assert "bad rows: 20" in capsys.readouterr().out
    assert Manifest.load(out).rows("train") == 1980


@pytest.fixture
def converted_six(tmp_path, capsys) -> tuple[Path, str]:
    """psrec synth + psrec convert --shards 6; returns (out dir, spec file)."""
    spec_file = _spec_file(tmp_path)
    assert main(["synth", "--spec", spec_file, "--rows", "3000", "--files",
                 "2", "--out", str(tmp_path / "parquet")]) == 0
    inputs = capsys.readouterr().out.split()
    assert len(inputs) == 2
    out = tmp_path / "out"
    assert main(["convert", *inputs, "--spec", spec_file, "--out", str(out),
                 "--shards", "6", "--block-rows", "50",
                 "--eval-fraction", "0.1"]) == 0
    summary = capsys.readouterr().out
    assert "wrote train 2700, eval 300" in summary
    assert str(out / MANIFEST_NAME) in summary
    return out, spec_file


def test_audit_shards_over_three_pipelines_exits_0(converted_six, capsys):
    out, spec_file = converted_six
    code = main(["audit-shards", str(out / MANIFEST_NAME), "--pipelines", "3",
                 "--spec", spec_file])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "overlap: 0" in text
    assert "coverage: 2700/2700 = 100.00%" in text
    counts = [int(line.split(":")[1].split()[0]) for line in text.splitlines()
              if line.strip().startswith("pipeline ")]
    assert len(counts) == 3 and sum(counts) == 2700
    assert "result: OK" in text


def test_audit_shards_with_too_few_shards_exits_2(converted_six, capsys):
    out, spec_file = converted_six
    code = main(["audit-shards", str(out), "--pipelines", "12", "--spec",
                 spec_file])
    assert code == 2
    assert "--shards 12" in capsys.readouterr().err


def test_audit_shards_reads_the_spec_saved_with_the_data(converted_six,
                                                         capsys):
    out, _ = converted_six
    assert main(["audit-shards", str(out), "--pipelines", "3"]) == 0
    text = capsys.readouterr().out
    assert "coverage: 2700/2700 = 100.00%" in text and "result: OK" in text


def test_audit_shards_of_older_data_needs_spec_for_non_preset(converted_six,
                                                              capsys):
    """A manifest written before the spec travelled with the data."""
    out, _ = converted_six
    record = json.loads((out / MANIFEST_NAME).read_text())
    del record["spec_file"]
    (out / MANIFEST_NAME).write_text(json.dumps(record))
    (out / "spec.yaml").unlink()
    assert main(["audit-shards", str(out), "--pipelines", "3"]) == 2
    assert "--spec" in capsys.readouterr().err


def test_audit_shards_on_corrupted_shard_exits_1_naming_file(
        converted_six, capsys):
    out, spec_file = converted_six
    victim = Path(Manifest.load(out).files("train")[3])
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x5A
    victim.write_bytes(bytes(data))
    code = main(["audit-shards", str(out), "--pipelines", "3", "--spec",
                 spec_file])
    assert code == 1
    err = capsys.readouterr().err
    assert str(victim) in err and "corrupted" in err


def test_audit_shards_on_truncated_shard_exits_1_naming_file(
        converted_six, capsys):
    out, spec_file = converted_six
    victim = Path(Manifest.load(out).files("train")[0])
    victim.write_bytes(victim.read_bytes()[:-37])
    code = main(["audit-shards", str(out), "--pipelines", "2", "--spec",
                 spec_file])
    assert code == 1
    assert str(victim) in capsys.readouterr().err


def test_audit_shards_without_manifest_exits_2(tmp_path, capsys):
    assert main(["audit-shards", str(tmp_path), "--pipelines", "1"]) == 2
    assert "no manifest" in capsys.readouterr().err


def test_synth_command_is_seeded(tmp_path, capsys):
    for name in ("a", "b"):
        assert main(["synth", "--spec", "movielens", "--rows", "500",
                     "--files", "1", "--seed", "9", "--out",
                     str(tmp_path / name)]) == 0
    capsys.readouterr()
    first = pq.read_table(next((tmp_path / "a").glob("*.parquet")))
    second = pq.read_table(next((tmp_path / "b").glob("*.parquet")))
    assert first.num_rows == 500 and first.equals(second)
    np.testing.assert_array_equal(
        first.column("user_id").to_numpy(),
        _library_user_ids(tmp_path / "c"))


def _library_user_ids(folder: Path) -> np.ndarray:
    """The library call behind ``psrec synth`` gives the same rows."""
    [path] = write_synthetic_parquet(movielens(), folder, 500, files=1, seed=9)
    return pq.read_table(path).column("user_id").to_numpy()


# -- --json ------------------------------------------------------------------


def _json_out(capsys) -> dict:
    """stdout is exactly one JSON object (one line)."""
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1, out
    data = json.loads(out)
    assert isinstance(data, dict)
    return data


def test_convert_json(tmp_path, capsys):
    spec_file = _spec_file(tmp_path)
    [path] = write_synthetic_parquet(SPEC, tmp_path / "pq", 1000, files=1)
    out = tmp_path / "out"
    assert main(["convert", path, "--spec", spec_file, "--out", str(out),
                 "--shards", "2", "--eval-fraction", "0.1", "--json"]) == 0
    data = _json_out(capsys)
    assert data["manifest"] == str(out / MANIFEST_NAME)
    assert data["rows_read"] == 1000
    assert data["rows_written"] == {"train": 900, "eval": 100}
    assert data["bad_rows"] == 0 and data["quarantine"] is None
    assert data["seconds"] > 0
    assert Manifest.load(out).rows("eval") == 100


def test_audit_shards_json(converted_six, capsys):
    out, spec_file = converted_six
    assert main(["audit-shards", str(out), "--pipelines", "3", "--spec",
                 spec_file, "--json"]) == 0
    data = _json_out(capsys)
    assert data["ok"] is True and data["overlap"] == 0
    assert data["split"] == "train" and data["pipelines"] == 3
    assert len(data["counts"]) == 3 and sum(data["counts"]) == 2700
    assert data["distinct"] == data["expected_rows"] == 2700
    assert data["coverage"] == 1.0


def test_ingest_criteo_json(tmp_path, capsys):
    ints = [str(i) for i in range(13)]
    cats = [f"{i:08x}" for i in range(26)]
    tsv = tmp_path / "day.txt"
    tsv.write_text("".join("\t".join([str(label)] + ints + cats) + "\n"
                           for label in (1, 0, 0, 1, 1)))
    assert main(["ingest", "criteo", str(tsv), "--out", str(tmp_path / "pq"),
                 "--json"]) == 0
    data = _json_out(capsys)
    assert data["rows"] == 5 and data["positives"] == 3
    [written] = data["files"]
    assert pq.read_table(written).num_rows == 5


def test_synth_and_spec_json(tmp_path, capsys):
    assert main(["synth", "--spec", "movielens", "--rows", "100", "--files",
                 "2", "--out", str(tmp_path), "--json"]) == 0
    data = _json_out(capsys)
    assert data["rows"] == 100 and len(data["files"]) == 2
    assert sum(pq.read_metadata(f).num_rows for f in data["files"]) == 100
    assert main(["spec", "movielens", "--json"]) == 0
    assert FeatureSpec.from_dict(_json_out(capsys)) == movielens()


# -- folders of Parquet ------------------------------------------------------


def test_convert_folder_converts_the_same_rows_as_listing_files(tmp_path,
                                                                 capsys):
    spec_file = _spec_file(tmp_path)
    folder = tmp_path / "pq"
    write_synthetic_parquet(SPEC, folder / "part", 1200, files=3, seed=4)
    (folder / "README.txt").write_text("not data")   # not *.parquet: skipped
    (folder / "_SUCCESS").write_text("")
    listed = sorted(str(p) for p in folder.rglob("*.parquet"))
    assert len(listed) == 3
    options = ["--spec", spec_file, "--shards", "3", "--eval-fraction",
               "0.25", "--json"]
    assert main(["convert", *listed, "--out", str(tmp_path / "a"),
                 *options]) == 0
    by_files = _json_out(capsys)
    assert main(["convert", str(folder), "--out", str(tmp_path / "b"),
                 *options]) == 0
    by_folder = _json_out(capsys)
    assert by_folder["rows_read"] == by_files["rows_read"] == 1200
    assert by_folder["rows_written"] == by_files["rows_written"]
    a, b = Manifest.load(tmp_path / "a"), Manifest.load(tmp_path / "b")
    assert [s["file"] for s in b.sources] == listed
    for split in ("train", "eval"):
        assert ([s.sha256 for s in a.shards[split]]
                == [s.sha256 for s in b.shards[split]])


def test_parquet_files_expands_folders_like_pyarrow(tmp_path):
    from psrec.data.convert.convert import parquet_files
    table = synthetic_table(SPEC, 10)
    for name in ("b.parquet", "a/z.parquet", "a/y.parquet", "_tmp/x.parquet",
                 ".hidden.parquet", "a/_x.parquet"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, tmp_path / name)
    single = tmp_path / "b.parquet"
    assert parquet_files([tmp_path, single]) == [
        str(tmp_path / "a/y.parquet"), str(tmp_path / "a/z.parquet"),
        str(single), str(single)]
    import pyarrow.dataset as ds
    found = ds.dataset(str(tmp_path), format="parquet").files
    assert sorted(found) == sorted(parquet_files([tmp_path])[:3])


def test_convert_empty_folder_is_one_line_naming_it(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "data.csv").write_text("a,b\n1,2\n")
    assert main(["convert", str(empty), "--spec", "criteo", "--out",
                 str(tmp_path / "out"), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    [line] = captured.err.strip().splitlines()
    assert line.startswith("psrec convert: error: ")
    assert str(empty) in line and "*.parquet" in line


def test_convert_non_parquet_file_is_one_line_naming_it(tmp_path, capsys):
    tsv = tmp_path / "day_0.txt"
    tsv.write_text("1\t2\t3\n")
    assert main(["convert", str(tsv), "--spec", "criteo", "--out",
                 str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    [line] = captured.err.strip().splitlines()
    assert line.startswith("psrec convert: error: ")
    assert str(tsv) in line and "not a Parquet file" in line
    assert "psrec ingest" in line
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()
