"""Tests for the generic ingest readers (data.tabular, data.libfm,
data.jsonl) and ``psrec ingest csv|libfm|jsonl``: real files in tmp_path
-> Parquet -> conversion."""

from __future__ import annotations

import bz2
import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from psrec.data.convert.convert import ConversionOptions
from psrec.data.convert.convert import convert
from psrec.data.ingest.common import IngestError
from psrec.data.ingest.common import find_line
from psrec.data.ingest.jsonl import ingest_jsonl
from psrec.data.ingest.libfm import ingest_libfm
from psrec.data.ingest.tabular import ingest_csv
from psrec.errors import EXIT_FAILURE
from psrec.errors import EXIT_USAGE
from psrec.features.spec.spec import FeatureSpec
from psrec.launch.cli.main import main
from tests.test_progress import Recorder

CSV_TEXT = ('id,click,price,city\n'
            '007,1,2.5,berlin\n'
            '008,0,,"paris, fr"\n'
            '009,1,4,\n')
CSV_ROWS = [{"id": "007", "click": 1, "price": 2.5, "city": "berlin"},
            {"id": "008", "click": 0, "price": None, "city": "paris, fr"},
            {"id": "009", "click": 1, "price": 4.0, "city": None}]
CSV_TYPES = {"click": "int64", "price": "float64"}


def _spec(label: str, categorical: list[str],
          dense: tuple[str, ...] = ()) -> FeatureSpec:
    """A tiny spec: each categorical column hashed into its own 100 rows."""
    return FeatureSpec.from_dict({
        "name": "generic", "label": {"name": label},
        "tables": [{"name": "ids", "rows": 100 * len(categorical), "dim": 4}],
        "dense": [{"name": name} for name in dense],
        "categorical": [{"name": name, "table": "ids", "hash_buckets": 100,
                         "row_offset": 100 * i}
                        for i, name in enumerate(categorical)]})


# -- csv ----------------------------------------------------------------------


def test_csv_plain_and_gzip_keep_ids_as_strings(tmp_path):
    (tmp_path / "day1.csv").write_text(CSV_TEXT)
    with gzip.open(tmp_path / "day2.csv.gz", "wt") as f:
        f.write(CSV_TEXT)
    recorder = Recorder()

    report = ingest_csv([tmp_path / "day1.csv", tmp_path / "day2.csv.gz"],
                        tmp_path / "out", column_types=CSV_TYPES,
                        progress=recorder)

    assert report.files == (str(tmp_path / "out" / "day1.parquet"),
                            str(tmp_path / "out" / "day2.parquet"))
    assert report.rows == 6 and report.positives is None
    for path in report.files:
        table = pq.read_table(path)
        assert table.schema == pa.schema([
            ("id", pa.string()), ("click", pa.int64()),
            ("price", pa.float64()), ("city", pa.string())])
        assert table.to_pylist() == CSV_ROWS
    # One pass over the bytes of both inputs as stored (gzip: compressed).
    (task,) = recorder.tasks
    stored = sum(p.stat().st_size for p in (tmp_path / "day1.csv",
                                            tmp_path / "day2.csv.gz"))
    assert (task.unit, task.total, task.done) == ("bytes", stored, stored)
    assert task.closed
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "day1.parquet", "day2.parquet"]  # no temporary files left


def test_csv_bz2_tab_no_header_and_named_columns(tmp_path):
    src = tmp_path / "log.tsv.bz2"
    src.write_bytes(bz2.compress(b"1\tu1\t00042\n0\tu2\t7\n"))

    auto = ingest_csv([src], tmp_path / "a", delimiter="\t", header=False)
    named = ingest_csv([src], tmp_path / "b", delimiter="\t", header=False,
                       columns=["click", "user", "item"],
                       column_types={"click": "bool"})

    assert pq.read_table(auto.files[0]).to_pylist() == [
        {"f0": "1", "f1": "u1", "f2": "00042"},
        {"f0": "0", "f1": "u2", "f2": "7"}]
    assert pq.read_table(named.files[0]).to_pylist() == [
        {"click": True, "user": "u1", "item": "00042"},
        {"click": False, "user": "u2", "item": "7"}]


def test_csv_type_mismatch_names_file_row_and_fix(tmp_path):
    src = tmp_path / "bad.csv"
    src.write_text("a,b\n" + "".join(f"{i},x\n" for i in range(500))
                   + "7,y\n12z,y\n")
    with pytest.raises(IngestError) as err:
        ingest_csv([src], tmp_path / "out", column_types={"a": "int64"},
                   block_size_bytes=1024)
    message = str(err.value)
    assert "data row 502" in message and "a='12z'" in message
    assert "--types a=string" in message and str(src) in message
    assert not (tmp_path / "out" / "bad.parquet").exists()
    assert list((tmp_path / "out").iterdir()) == []


def test_csv_wrong_field_count_names_the_line(tmp_path):
    src = tmp_path / "cols.csv"
    src.write_text("a,b,c\n1,2,3\n4,5\n6,7,8\n")
    with pytest.raises(IngestError, match=r"line 3 has 2 fields instead of 3"):
        ingest_csv([src], tmp_path / "out")


@pytest.mark.parametrize("kwargs, match", [
    ({"delimiter": ";;"}, r"`delimiter` = ';;' must be one character"),
    ({"delimiter": "\n"}, r"`delimiter`"),
    ({"column_types": {"a": "int"}}, r"`types\[a\]` = 'int' must be one of"),
    ({"column_types": {"zz": "int64"}}, r"names column\(s\) \['zz'\]"),
    ({"columns": ["x"]}, r"--columns names 1 columns but line 1 has 3"),
])
def test_csv_bad_options_are_refused_before_writing(tmp_path, kwargs, match):
    src = tmp_path / "t.csv"
    src.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(IngestError, match=match):
        ingest_csv([src], tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_missing_and_empty_inputs(tmp_path):
    with pytest.raises(IngestError, match="does not exist"):
        ingest_csv([tmp_path / "nope.csv"], tmp_path / "out")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(IngestError, match="is empty"):
        ingest_csv([tmp_path / "empty.csv"], tmp_path / "out")
    (tmp_path / "a.libfm").write_text("")
    with pytest.raises(IngestError, match="is empty"):
        ingest_libfm([tmp_path / "a.libfm"], tmp_path / "out")


def test_find_line_across_chunks(tmp_path):
    src = tmp_path / "t.txt"
    src.write_text("".join(f"row {i}\n" for i in range(1000)))
    assert find_line(src, "row 0", chunk=64) == 1
    assert find_line(src, "row 777", chunk=64) == 778
    assert find_line(src, "row 77", chunk=64) == 78
    assert find_line(src, "row 1000", chunk=64) is None


# -- libfm --------------------------------------------------------------------


def test_libfm_labels_fields_and_values(tmp_path):
    src = tmp_path / "train.libfm.gz"
    with gzip.open(src, "wt") as f:
        f.write("-1 0:5:1 1:7:1\n"
                "1 0:6:1 1:7:2.5\n"
                "+1 1:9:1\n")

    report = ingest_libfm([src], tmp_path / "out", fields=["user", "item"])

    assert report.files == (str(tmp_path / "out" / "train.parquet"),)
    assert report.rows == 3 and report.positives == 2
    table = pq.read_table(report.files[0])
    # user values are all 1 -> no user_value column; item has a 2.5.
    assert table.schema.names == ["label", "user", "item", "item_value"]
    assert table.to_pylist() == [
        {"label": 0, "user": "5", "item": "7", "item_value": 1.0},
        {"label": 1, "user": "6", "item": "7", "item_value": 2.5},
        {"label": 1, "user": None, "item": "9", "item_value": 1.0}]


def test_libfm_libsvm_positions_name_fields_and_convert(tmp_path):
    # libSVM form (`label index:value`): the k-th feature is field k.
    rng = np.random.default_rng(3)
    labels = rng.choice(["-1", "1"], size=500, p=[0.7, 0.3])
    lines = [f"{label} " + " ".join(f"{rng.integers(0, 40) + 100 * k}:1"
                                    for k in range(4))
             for label in labels]
    src = tmp_path / "positions.libsvm"
    src.write_text("\n".join(lines) + "\n")
    report = ingest_libfm([src], tmp_path / "pq")
    table = pq.read_table(report.files[0])
    assert table.schema.names == ["label"] + [f"f{k}" for k in range(4)]
    first = lines[0].split()
    assert table.slice(0, 1).to_pylist()[0] == {
        "label": int(first[0] == "1"),
        **{f"f{k}": tok.split(":")[0] for k, tok in enumerate(first[1:])}}
    assert report.rows == 500
    assert report.positives == int((labels == "1").sum())

    spec = _spec("label", [f"f{k}" for k in range(4)])
    result = convert(report.files, spec, tmp_path / "tfr",
                     ConversionOptions(shards=2))
    assert result.bad_rows == 0 and result.rows_read == 500


@pytest.mark.parametrize("body, match", [
    ("1 0:1:1\n3 0:2:1\n", r"line 2 \('3 0:2:1'\): label '3' is not 1, 0"),
    ("1 0:1:1\n-1 0:2:1\n0 0:3:1\n", r"line 3 .*label 0 in a file whose "
     r"negatives are -1"),
    ("1 0:1:1\n\n1 0:2:1\n", r"line 2 .*empty"),
    ("1 0:1:1 1:2\n", r"line 1 .*'1:2' does not have the 3-part form"),
    ("1 0:1:1 0:2:1\n", r"line 1 .*two features in one field"),
    ("1 0:1:x\n", r"line 1 .*not a number"),
])
def test_libfm_bad_lines_are_refused_not_skipped(tmp_path, body, match):
    src = tmp_path / "b.libfm"
    src.write_text(body)
    with pytest.raises(IngestError, match=match):
        ingest_libfm([src], tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


def test_libfm_field_beyond_fields_is_refused(tmp_path):
    src = tmp_path / "b.libfm"
    src.write_text("1 1:1 2:1\n0 4:1 5:1 6:1\n")
    with pytest.raises(IngestError, match=r"line 2 .*beyond the 2 known"):
        ingest_libfm([src], tmp_path / "out", fields=["a", "b"])


# -- jsonl --------------------------------------------------------------------


def test_jsonl_flattens_objects_and_keeps_json_types(tmp_path):
    rows = [{"user": "007", "item": 3, "ctx": {"dev": "ios",
                                               "geo": {"cc": "de"}},
             "tags": ["a", "b"], "label": 1, "note": None},
            {"user": "008", "item": 4, "ctx": {"dev": "web"}, "tags": [],
             "label": 0, "note": None}]
    src = tmp_path / "log.jsonl.gz"
    with gzip.open(src, "wt") as f:
        f.write("".join(json.dumps(row) + "\n" for row in rows))

    report = ingest_jsonl([src], tmp_path / "pq")

    table = pq.read_table(report.files[0])
    assert report.rows == 2 and report.positives is None
    assert table.schema.names == ["user", "item", "ctx.dev", "ctx.geo.cc",
                                  "tags", "label", "note"]
    assert table.schema.field("item").type == pa.int64()
    assert table.schema.field("note").type == pa.string()
    assert table.to_pylist()[1] == {
        "user": "008", "item": 4, "ctx.dev": "web", "ctx.geo.cc": None,
        "tags": [], "label": 0, "note": None}

    spec = _spec("label", ["user", "ctx.dev"], dense=("item",))
    result = convert(report.files, spec, tmp_path / "tfr",
                     ConversionOptions(shards=1))
    assert result.bad_rows == 0 and result.rows_read == 2


def test_jsonl_type_change_and_new_field_name_line_and_fix(tmp_path):
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"a": 1}\n{"a": "x"}\n')
    with pytest.raises(IngestError, match=r"line 2: .*field 'a' must hold "
                       "one JSON type"):
        ingest_jsonl([mixed], tmp_path / "out")
    src = tmp_path / "a.jsonl"
    src.write_text("".join(f'{{"a": {i}, "b": "{"x" * 30}"}}\n'
                           for i in range(300)) + '{"a": 1.5}\n')
    # pyarrow names neither field nor row of a conversion error: the
    # message says which block (after how many good lines) and the value.
    with pytest.raises(IngestError, match=r"after line \d+ .*parse:1\.5; "
                       "declare .* --types FIELD=float64"):
        ingest_jsonl([src], tmp_path / "out", block_size_bytes=4096)
    typed = ingest_jsonl([src], tmp_path / "out", block_size_bytes=4096,
                         column_types={"a": "float64"})
    assert pq.read_table(typed.files[0]).column("a").to_pylist() == [
        float(i) for i in range(300)] + [1.5]

    late = tmp_path / "late.jsonl"
    late.write_text("".join(f'{{"a": {i}, "b": "{"x" * 30}"}}\n'
                            for i in range(300)) + '{"a": 1, "zz": 2}\n')
    with pytest.raises(IngestError, match=r"first block does not have"):
        ingest_jsonl([late], tmp_path / "out2", block_size_bytes=4096)
    nested = tmp_path / "n.jsonl"
    nested.write_text('{"a": [{"b": 1}]}\n')
    with pytest.raises(IngestError, match=r"field 'a' holds lists of"):
        ingest_jsonl([nested], tmp_path / "out3")


# -- CLI ----------------------------------------------------------------------


def test_cli_ingest_csv_libfm_jsonl(tmp_path, capsys):
    (tmp_path / "t.csv").write_text(CSV_TEXT.replace(",", ";"))
    assert main(["ingest", "csv", str(tmp_path / "t.csv"), "--out",
                 str(tmp_path / "c"), "--delimiter", ";", "--types",
                 "click=int64,price=float64", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rows"] == 3
    assert pq.read_table(data["files"][0]).to_pylist() == [
        {**row, "city": row["city"] and row["city"].replace(",", ";")}
        for row in CSV_ROWS]

    (tmp_path / "t.libfm").write_text("1 3:1 4:1\n-1 5:1 6:1\n")
    assert main(["ingest", "libfm", str(tmp_path / "t.libfm"), "--out",
                 str(tmp_path / "l"), "--fields", "user,item"]) == 0
    assert "2 rows in 1 parquet file, 1 positives" in capsys.readouterr().out
    assert pq.read_table(tmp_path / "l" / "t.parquet").to_pylist() == [
        {"label": 1, "user": "3", "item": "4"},
        {"label": 0, "user": "5", "item": "6"}]

    (tmp_path / "t.jsonl").write_text('{"u": "a"}\n{"u": "b"}\n')
    assert main(["ingest", "jsonl", str(tmp_path / "t.jsonl"), "--out",
                 str(tmp_path / "j")]) == 0
    assert "2 rows" in capsys.readouterr().out


@pytest.mark.parametrize("argv, match, code", [
    (["libfm", "IN", "--delimiter", ";"], "--delimiter applies to ingest csv",
     EXIT_USAGE),
    (["criteo", "IN", "--fields", "a"], "--fields applies to ingest libfm",
     EXIT_USAGE),
    (["csv", "IN", "--types", "click"], "--types 'click': give COL=TYPE",
     EXIT_USAGE),
    (["csv", "IN", "--delimiter", "::"], "`delimiter` = '::'", EXIT_USAGE),
    (["csv", "MISSING"], "input file not found", EXIT_USAGE),
    # a value that does not parse is bad data
    (["csv", "IN", "--types", "a=int64"], "data row 1 has a='x'",
     EXIT_FAILURE),
])
def test_cli_ingest_errors_are_one_line(tmp_path, capsys, argv, match, code):
    (tmp_path / "in.csv").write_text("a\nx\n")
    argv = [str(tmp_path / "in.csv") if a == "IN" else
            str(tmp_path / "missing.csv") if a == "MISSING" else a
            for a in argv]
    assert main(["ingest", *argv, "--out", str(tmp_path / "o")]) == code
    err = capsys.readouterr().err.strip()
    # A row that fails is found while reading: the progress display (label
    # and bar lines, ended where the reading stopped) comes first.
    *shown, error = err.splitlines()
    assert error.startswith("psrec ingest: error: ") and match in error, err
    if shown:
        assert shown[0] == "ingest 1 file (MiB)", err
        assert all(line.startswith("0/1 [") for line in shown[1:]), err
    assert "Traceback" not in err


def test_cli_ingest_tab_delimiter_spelling(tmp_path, capsys):
    (tmp_path / "t.tsv").write_text("a\tb\n1\t2\n")
    for spelling in ("tab", "\\t"):
        assert main(["ingest", "csv", str(tmp_path / "t.tsv"), "--out",
                     str(tmp_path / spelling.strip("\\")), "--delimiter",
                     spelling, "--json"]) == 0
        [path] = json.loads(capsys.readouterr().out)["files"]
        assert pq.read_table(path).to_pylist() == [{"a": "1", "b": "2"}]


def test_output_names_must_differ(tmp_path):
    (tmp_path / "x").mkdir()
    for path in (tmp_path / "a.csv", tmp_path / "x" / "a.csv"):
        Path(path).write_text("a\n1\n")
    with pytest.raises(IngestError, match="same output name"):
        ingest_csv([tmp_path / "a.csv", tmp_path / "x" / "a.csv"],
                   tmp_path / "out")


def test_cli_no_header_columns_and_verbatim_header(tmp_path, capsys):
    (tmp_path / "h.csv").write_text('007,"x,y"\n1,2\n')
    assert main(["ingest", "csv", str(tmp_path / "h.csv"), "--out",
                 str(tmp_path / "a"), "--json"]) == 0
    [path] = json.loads(capsys.readouterr().out)["files"]
    assert pq.read_table(path).to_pylist() == [{"007": "1", "x,y": "2"}]
    assert main(["ingest", "csv", str(tmp_path / "h.csv"), "--out",
                 str(tmp_path / "b"), "--no-header", "--columns", "u,i",
                 "--json"]) == 0
    [path] = json.loads(capsys.readouterr().out)["files"]
    assert pq.read_table(path).to_pylist() == [{"u": "007", "i": "x,y"},
                                               {"u": "1", "i": "2"}]
