"""A first hour without surprises, the data side (issue 23): empty input,
an output folder holding other data, exit codes of bad data and the odd
messages, each through ``psrec.launch.cli.main.main`` in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from psrec.launch.cli.main import main


def _csv(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _one_error_line(capsys) -> str:
    """The one line the error is (progress lines aside)."""
    err = [line for line in capsys.readouterr().err.splitlines()
           if line.startswith("psrec")]
    assert len(err) == 1, err
    return err[0]


def _parquet(path: Path, **columns) -> str:
    pq.write_table(pa.table(columns), path)
    return str(path)


# -- exit codes: bad data is exit 1 ------------------------------------------


def test_a_non_numeric_value_in_a_numeric_column_is_bad_data(tmp_path,
                                                             capsys):
    src = _csv(tmp_path / "log.csv", "click,x\n1,a\nyes,b\n")
    code = main(["ingest", "csv", src, "--out", str(tmp_path / "pq"),
                 "--types", "click=int64"])
    line = _one_error_line(capsys)
    assert code == 1, line
    assert "log.csv" in line and "yes" in line


def test_an_unknown_types_column_is_still_a_user_mistake(tmp_path, capsys):
    src = _csv(tmp_path / "log.csv", "click,x\n1,a\n")
    code = main(["ingest", "csv", src, "--out", str(tmp_path / "pq"),
                 "--types", "clik=int64"])
    assert code == 2, _one_error_line(capsys)


def _spec(tmp_path: Path) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text("name: tiny\nlabel: {name: click}\n"
                    "dense: [{name: price}]\n")
    return str(path)


def test_a_missing_label_column_is_bad_data(tmp_path, capsys):
    src = _parquet(tmp_path / "a.parquet", price=[1.0, 2.0])
    code = main(["convert", src, "--spec", _spec(tmp_path), "--out",
                 str(tmp_path / "tf")])
    line = _one_error_line(capsys)
    assert code == 1, line
    assert "'click'" in line and "missing" in line


def test_a_string_where_a_number_is_needed_is_bad_data(tmp_path, capsys):
    src = _parquet(tmp_path / "a.parquet", click=["1", "0"], price=[1.0, 2.0])
    code = main(["convert", src, "--spec", _spec(tmp_path), "--out",
                 str(tmp_path / "tf")])
    line = _one_error_line(capsys)
    assert code == 1, line
    assert "'click'" in line and "string" in line


# -- spec infer: a string label names the fix --------------------------------


def test_infer_a_string_label_names_the_ingest_fix(tmp_path, capsys):
    src = _parquet(tmp_path / "a.parquet", click=["1", "0", "1"],
                   price=[1.0, 2.0, 3.0])
    code = main(["spec", "infer", src, "--label", "click", "--out",
                 str(tmp_path / "s.yaml")])
    line = _one_error_line(capsys)
    assert code == 1, line
    assert "psrec ingest csv" in line and "--types click=int64" in line


def test_infer_a_misspelt_label_suggests_the_column(tmp_path, capsys):
    src = _parquet(tmp_path / "a.parquet", click=[1, 0, 1],
                   price=[1.0, 2.0, 3.0])
    code = main(["spec", "infer", src, "--label", "clik", "--out",
                 str(tmp_path / "s.yaml")])
    line = _one_error_line(capsys)
    assert code == 2, line
    assert "did you mean 'click'?" in line


# -- empty input is a data error ---------------------------------------------


def test_ingest_a_header_only_csv_is_refused_naming_it(tmp_path, capsys):
    src = _csv(tmp_path / "head.csv", "click,price\n")
    code = main(["ingest", "csv", src, "--out", str(tmp_path / "pq")])
    line = _one_error_line(capsys)
    assert code == 1, line
    assert "head.csv" in line and "no data row" in line
    assert not list((tmp_path / "pq").glob("*.parquet"))


def test_convert_zero_rows_is_refused_naming_the_input(tmp_path, capsys):
    src = _parquet(tmp_path / "none.parquet",
                   click=pa.array([], pa.int64()),
                   price=pa.array([], pa.float64()))
    out = tmp_path / "tf"
    code = main(["convert", src, "--spec", _spec(tmp_path), "--out",
                 str(out), "--eval-fraction", "0.1"])
    line = _one_error_line(capsys)
    assert code == 1, line
    assert "none.parquet" in line and "no rows" in line
    assert not (out / "manifest.json").exists()


def _convert(tmp_path: Path, src: str, out: Path, *flags: str) -> int:
    return main(["convert", src, "--spec", _spec(tmp_path), "--out",
                 str(out), "--shards", "1", *flags])


def test_train_on_a_zero_row_split_is_refused_before_it_starts(tmp_path,
                                                               capsys):
    src = _parquet(tmp_path / "a.parquet", click=[1, 0, 1, 0],
                   price=[1.0, 2.0, 3.0, 4.0])
    out = tmp_path / "tf"
    assert _convert(tmp_path, src, out) == 0
    # A folder an older psrec wrote from a header-only CSV: 0 train rows.
    manifest = json.loads((out / "manifest.json").read_text())
    for shard in manifest["shards"]["train"]:
        shard["rows"] = 0
    (out / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    code = main(["train", "--data", str(out), "--workdir",
                 str(tmp_path / "w"), "--steps", "1"])
    line = _one_error_line(capsys)
    assert code == 1, line
    assert str(out) in line and "0 rows" in line
    assert not (tmp_path / "w").exists()  # refused before anything started


# -- an output folder holding other data -------------------------------------


def test_convert_refuses_a_folder_of_other_inputs_unless_overwrite(tmp_path,
                                                                  capsys):
    a = _parquet(tmp_path / "a.parquet", click=[1, 0], price=[1.0, 2.0])
    b = _parquet(tmp_path / "b.parquet", click=[0, 1, 1], price=[3.0, 4.0,
                                                                  5.0])
    out = tmp_path / "tf"
    assert _convert(tmp_path, a, out) == 0
    before = (out / "manifest.json").read_bytes()
    capsys.readouterr()
    assert _convert(tmp_path, b, out) == 2
    line = _one_error_line(capsys)
    assert str(out) in line and "--out" in line and "--overwrite" in line
    assert (out / "manifest.json").read_bytes() == before  # untouched
    # The same conversion again is allowed (byte-identical output) ...
    assert _convert(tmp_path, a, out) == 0
    assert (out / "manifest.json").read_bytes() == before
    # ... and --overwrite replaces it.
    assert _convert(tmp_path, b, out, "--overwrite") == 0
    assert b"b.parquet" in (out / "manifest.json").read_bytes()


# -- messages ----------------------------------------------------------------


def test_a_data_folder_that_does_not_exist_is_named_so(tmp_path, capsys):
    missing = tmp_path / "nope"
    code = main(["audit-shards", str(missing), "--pipelines", "1"])
    line = _one_error_line(capsys)
    assert code == 2, line
    assert f"{missing} does not exist" in line
    assert "did not complete" not in line


def test_a_cli_user_is_told_the_allow_remote_flag(capsys):
    code = main(["tf-config", "--ps-hosts", "10.0.0.1:2222",
                 "--worker-hosts", "10.0.0.2:2222"])
    line = _one_error_line(capsys)
    assert code == 2, line
    assert "needs `--allow-remote`" in line
    assert "allow_remote" not in line


def test_spec_infer_takes_the_files_after_the_flags(tmp_path, capsys):
    src = _parquet(tmp_path / "a.parquet", click=[1, 0, 1, 0],
                   price=[1.0, 2.0, 3.0, 4.0])
    out = tmp_path / "s.yaml"
    assert main(["spec", "infer", "--label", "click", "--out", str(out),
                 src]) == 0
    assert out.is_file()


def test_a_stray_argument_is_still_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["spec", "criteo", "--out", "x.yaml", "stray", "--nope"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


# -- did you mean ------------------------------------------------------------


def test_a_misspelt_model_name_suggests_the_model(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--model", "deepffm", "--workdir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "did you mean 'deepfm'?" in _one_error_line(capsys)


def test_a_misspelt_preset_suggests_the_preset(capsys):
    assert main(["spec", "critoe"]) == 2
    assert "did you mean 'criteo'?" in _one_error_line(capsys)


def test_a_misspelt_spec_key_suggests_the_key(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text("name: tiny\nlabel: {name: click}\n"
                    "dens: [{name: price}]\n")
    assert main(["spec", str(path)]) == 2
    assert "unknown key 'dens'; did you mean 'dense'?" in _one_error_line(
        capsys)


def test_a_misspelt_label_column_suggests_the_column(tmp_path, capsys):
    src = _parquet(tmp_path / "a.parquet", clicks=[1, 0], price=[1.0, 2.0])
    code = main(["convert", src, "--spec", _spec(tmp_path), "--out",
                 str(tmp_path / "tf")])
    line = _one_error_line(capsys)
    assert code == 1, line
    assert "did you mean 'clicks'?" in line
