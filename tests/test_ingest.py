"""Tests for data.ingest, .criteo and .movielens: raw files -> Parquet."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from psrec.data.ingest.common import IngestError
from psrec.data.ingest.common import IngestReport
from psrec.data.ingest.criteo import CRITEO_CATEGORICAL_COLUMNS
from psrec.data.ingest.criteo import CRITEO_COLUMNS
from psrec.data.ingest.criteo import CRITEO_INTEGER_COLUMNS
from psrec.data.ingest.criteo import ingest_criteo
from psrec.data.ingest.movielens import ingest_movielens
from tests._shared import CRITEO_SAMPLE
from tests._shared import MOVIELENS_DIR
from tests._shared import shared_data


def _criteo_line(
    label: int | None, i_values: list[str], c_values: list[str]
) -> str:
    fields = ([] if label is None else [str(label)]) + i_values + c_values
    return "\t".join(fields) + "\n"


def _good_criteo_line(label: int | None = 1) -> str:
    ints = [str(i - 3) for i in range(13)]
    ints[5] = ""
    cats = [f"{i:08x}" for i in range(26)]
    cats[7] = ""
    return _criteo_line(label, ints, cats)


def _hand_parse_criteo(line: str) -> dict[str, object]:
    fields = line.rstrip("\n").split("\t")
    assert len(fields) == 40
    row: dict[str, object] = {}
    for name, text in zip(CRITEO_COLUMNS, fields):
        if text == "":
            row[name] = None
        elif name in CRITEO_CATEGORICAL_COLUMNS:
            row[name] = text
        else:
            row[name] = int(text)
    return row


# --------------------------------------------------------------------------
# Criteo
# --------------------------------------------------------------------------


def test_criteo_sample_rows_positives_schema_and_name(tmp_path):
    src = shared_data(CRITEO_SAMPLE)
    out = tmp_path / "out"

    report = ingest_criteo([src], out)

    expected_file = out / "criteo_combined_10390.parquet"
    assert isinstance(report, IngestReport)
    assert report.files == (str(expected_file),)
    assert report.rows == 10_390
    assert report.positives == 2_269
    assert "10,390 rows" in report.summary()
    assert "2,269 positives" in report.summary()
    assert "\n" not in report.summary()

    table = pq.read_table(expected_file)
    assert table.num_rows == 10_390
    assert table.schema.names == list(CRITEO_COLUMNS)
    assert table.schema.field("label").type == pa.int64()
    for name in CRITEO_INTEGER_COLUMNS:
        assert table.schema.field(name).type == pa.int64(), name
    for name in CRITEO_CATEGORICAL_COLUMNS:
        assert table.schema.field(name).type == pa.string(), name


def test_criteo_values_and_nulls_match_raw_text(tmp_path):
    src = shared_data(CRITEO_SAMPLE)
    lines = src.read_text(encoding="ascii").splitlines(keepends=True)
    report = ingest_criteo([src], tmp_path)
    table = pq.read_table(report.files[0])

    # Line 6 has empty integer and categorical fields and a negative integer.
    known = _hand_parse_criteo(lines[5])
    assert known["I1"] is None and known["I2"] == -1
    assert table.slice(5, 1).to_pylist()[0] == known

    # Every column's null count equals the number of empty raw fields.
    parsed = [line.rstrip("\n").split("\t") for line in lines]
    for index, name in enumerate(CRITEO_COLUMNS):
        empty = sum(1 for fields in parsed if fields[index] == "")
        assert table.column(name).null_count == empty, name
    assert table.column("I12").null_count > 0
    assert table.column("C22").null_count > 0


def test_criteo_small_blocks_stream_to_same_table(tmp_path):
    src = shared_data(CRITEO_SAMPLE)
    whole = ingest_criteo([src], tmp_path / "whole")
    streamed = ingest_criteo(
        [src], tmp_path / "blocks", block_size_bytes=1 << 16
    )

    assert streamed.rows == whole.rows
    assert streamed.positives == whole.positives
    assert pq.ParquetFile(streamed.files[0]).metadata.num_row_groups > 1
    streamed_table = pq.read_table(streamed.files[0])
    assert streamed_table.equals(pq.read_table(whole.files[0]))


def test_criteo_leaves_no_temporary_file(tmp_path):
    src = shared_data(CRITEO_SAMPLE)
    ingest_criteo([src], tmp_path, block_size_bytes=1 << 16)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "criteo_combined_10390.parquet"
    ]


def test_criteo_wrong_field_count_names_file(tmp_path):
    bad = tmp_path / "broken_day.tsv"
    short = _good_criteo_line().rstrip("\n").rsplit("\t", 1)[0] + "\n"
    bad.write_text(_good_criteo_line() * 2 + short + _good_criteo_line())
    out = tmp_path / "out"

    with pytest.raises(IngestError) as info:
        ingest_criteo([bad], out)

    message = str(info.value)
    assert "broken_day.tsv" in message
    assert "39" in message and "40" in message
    assert list(out.iterdir()) == []  # neither a final nor a temporary file


def test_criteo_unparsable_integer_names_file_and_column(tmp_path):
    bad = tmp_path / "bad_int.tsv"
    ints = ["1"] * 13
    ints[2] = "12x"
    cats = ["68fd1e64"] * 26
    bad.write_text(_good_criteo_line() + _criteo_line(0, ints, cats))

    with pytest.raises(IngestError) as info:
        ingest_criteo([bad], tmp_path / "out")

    message = str(info.value)
    assert "bad_int.tsv" in message
    assert "I3" in message and "12x" in message


def test_criteo_failure_keeps_previous_output(tmp_path):
    out = tmp_path / "out"
    good = tmp_path / "a" / "day.tsv"
    good.parent.mkdir()
    good.write_text(_good_criteo_line() * 3)
    first = ingest_criteo([good], out)
    before = pq.read_table(first.files[0])

    bad = tmp_path / "b" / "day.tsv"
    bad.parent.mkdir()
    bad.write_text(_good_criteo_line() * 500 + "1\t2\n")
    with pytest.raises(IngestError, match="day.tsv"):
        ingest_criteo([bad], out, block_size_bytes=4096)

    assert sorted(p.name for p in out.iterdir()) == ["day.parquet"]
    assert pq.read_table(out / "day.parquet").equals(before)


def test_criteo_one_file_per_input_and_unlabelled_layout(tmp_path):
    a = tmp_path / "part_a.txt"
    b = tmp_path / "part_b.txt"
    a.write_text(_good_criteo_line(1) * 2)
    b.write_text(_good_criteo_line(0) + _good_criteo_line(1) * 3)
    report = ingest_criteo([a, b], tmp_path / "out")
    assert [Path(f).name for f in report.files] == [
        "part_a.parquet",
        "part_b.parquet",
    ]
    assert (report.rows, report.positives) == (6, 5)

    test_file = tmp_path / "test.txt"
    test_file.write_text(_good_criteo_line(None) * 4)
    unlabelled = ingest_criteo([test_file], tmp_path / "out2")
    assert (unlabelled.rows, unlabelled.positives) == (4, None)
    table = pq.read_table(unlabelled.files[0])
    assert table.schema.names == list(CRITEO_COLUMNS[1:])
    assert table.column("I6").null_count == 4
    assert "unlabelled" in unlabelled.summary()

    with pytest.raises(IngestError, match="mix"):
        ingest_criteo([a, test_file], tmp_path / "out3")


def test_criteo_rejects_missing_and_empty_inputs(tmp_path):
    with pytest.raises(IngestError, match="nope.tsv"):
        ingest_criteo([tmp_path / "nope.tsv"], tmp_path / "out")
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    with pytest.raises(IngestError, match="empty.tsv"):
        ingest_criteo([empty], tmp_path / "out")


# --------------------------------------------------------------------------
# MovieLens
# --------------------------------------------------------------------------


def test_movielens_rows_schema_order_and_join(tmp_path):
    ml = shared_data(MOVIELENS_DIR)
    out = tmp_path / "out"
    report = ingest_movielens(ml, out)

    data_lines = (ml / "u.data").read_text().splitlines()
    ratings = [[int(x) for x in line.split("\t")] for line in data_lines]
    # Time order; ratings of the same second keep their u.data order.
    ratings.sort(key=lambda r: r[3])
    assert report.files == (str(out / "movielens.parquet"),)
    assert report.rows == 100_000
    assert report.positives == sum(1 for r in ratings if r[2] >= 4)

    table = pq.read_table(report.files[0])
    assert table.schema.names == [
        "user_id", "item_id", "rating", "timestamp", "genres",
        "age", "gender", "occupation", "zip",
    ]
    for name in ("user_id", "item_id", "rating", "timestamp", "age"):
        assert table.schema.field(name).type == pa.int64(), name
    for name in ("gender", "occupation", "zip"):
        assert table.schema.field(name).type == pa.string(), name
    genres_type = table.schema.field("genres").type
    assert pa.types.is_list(genres_type)
    assert genres_type.value_type == pa.string()

    # Whole id columns match the raw file sorted by time (stable).
    assert table.column("user_id").to_pylist() == [r[0] for r in ratings]
    assert table.column("item_id").to_pylist() == [r[1] for r in ratings]

    users = {
        line.split("|")[0]: line.split("|")
        for line in (ml / "u.user").read_text().splitlines()
    }
    first = table.slice(0, 1).to_pylist()[0]
    user_id, item_id, rating, timestamp = ratings[0]
    _, age, gender, occupation, zip_code = users[str(user_id)]
    assert first["user_id"] == user_id and first["item_id"] == item_id
    assert first["rating"] == rating and first["timestamp"] == timestamp
    assert (first["age"], first["gender"]) == (int(age), gender)
    assert (first["occupation"], first["zip"]) == (occupation, zip_code)


def test_movielens_genres_match_raw_item_line(tmp_path):
    ml = shared_data(MOVIELENS_DIR)
    report = ingest_movielens(ml, tmp_path)
    table = pq.read_table(report.files[0])

    genre_names = [
        line.split("|")[0]
        for line in (ml / "u.genre").read_text().splitlines()
        if line
    ]
    item_lines = (ml / "u.item").read_text(encoding="latin-1").splitlines()
    star_wars = next(line for line in item_lines if line.startswith("50|"))
    flags = star_wars.split("|")[5:]
    expected = [g for g, flag in zip(genre_names, flags) if flag == "1"]
    assert expected == ["Action", "Adventure", "Romance", "Sci-Fi", "War"]

    rows = table.filter(pa.compute.equal(table.column("item_id"), 50))
    assert rows.num_rows > 0
    assert all(g == expected for g in rows.column("genres").to_pylist())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["movielens.parquet"]


def _copy_movielens(tmp_path: Path) -> Path:
    src = shared_data(MOVIELENS_DIR)
    dst = tmp_path / "ml"
    dst.mkdir()
    for name in ("u.data", "u.item", "u.genre", "u.user"):
        shutil.copyfile(src / name, dst / name)
    return dst


def test_movielens_missing_user_names_id(tmp_path):
    ml = _copy_movielens(tmp_path)
    users = (ml / "u.user").read_text().splitlines(keepends=True)
    (ml / "u.user").write_text(
        "".join(line for line in users if not line.startswith("196|"))
    )
    out = tmp_path / "out"

    with pytest.raises(IngestError) as info:
        ingest_movielens(ml, out)

    message = str(info.value)
    assert "user id(s) 196 " in message
    assert "u.user" in message
    assert not (out / "movielens.parquet").exists()


def test_movielens_missing_item_names_id(tmp_path):
    ml = _copy_movielens(tmp_path)
    items = (ml / "u.item").read_bytes().splitlines(keepends=True)
    (ml / "u.item").write_bytes(
        b"".join(line for line in items if not line.startswith(b"242|"))
    )
    with pytest.raises(IngestError, match=r"item id\(s\) 242 .*u\.item"):
        ingest_movielens(ml, tmp_path / "out")
