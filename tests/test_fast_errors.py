"""A wrong input path answers without importing TensorFlow: each command
that takes paths refuses a missing one before its run module (and
TensorFlow) is imported; ``psrec ingest csv`` and ``psrec spec infer``
never import it, progress bar included. Each case runs ``main`` in a fresh
Python process (what one ``psrec`` run imports), so a module another test
imported cannot hide an import. How fast: benchmarks, not here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

_RUN = """
import json, sys
from psrec.launch.cli.main import main
code = main(json.loads(sys.argv[1]))
print(json.dumps({"code": code, "tensorflow": "tensorflow" in sys.modules}))
"""


def _psrec(argv: list[str], cwd: Path) -> tuple[int, bool, list[str], str]:
    """``psrec ARGV`` in a fresh process: exit code, whether TensorFlow
    was imported, the lines on stderr, stdout before the result."""
    done = subprocess.run([sys.executable, "-c", _RUN, json.dumps(argv)],
                          cwd=cwd, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    *out, last = done.stdout.splitlines()
    result = json.loads(last)
    return (result["code"], result["tensorflow"],
            done.stderr.splitlines(), "\n".join(out))


# (argv with {nope} for a path that does not exist, {file} for one that
# does, {dir} for the test's folder; what the error line says)
_MISSING = {
    "convert": (["convert", "{nope}", "--spec", "criteo", "--out", "{dir}/o"],
                "input Parquet not found: {nope}"),
    "convert --spec": (["convert", "{file}", "--spec", "{nope}", "--out",
                        "{dir}/o"], "'{nope}' is neither a preset"),
    "audit-shards": (["audit-shards", "{nope}", "--pipelines", "2"],
                     "{nope} does not exist"),
    "train --data": (["train", "--data", "{nope}", "--workdir", "{dir}/w"],
                     "{nope} does not exist"),
    "train --cluster": (["train", "--cluster", "{nope}", "--workdir",
                         "{dir}/w"], "cluster file {nope} does not exist"),
    "server --cluster": (["server", "--cluster", "{nope}", "--role", "ps",
                          "--index", "0"], "cluster file {nope} does not "
                         "exist"),
    "eval --data": (["eval", "{dir}", "--data", "{nope}"],
                    "{nope} does not exist"),
    "export": (["export", "{nope}", "--out", "{dir}/e"],
               "{nope}/job.json not found"),
    "predict --model": (["predict", "--model", "{nope}", "--data", "{file}",
                         "--out", "{dir}/s.csv"],
                        "export folder not found: {nope}"),
    "predict --data": (["predict", "--model", "{dir}", "--data", "{nope}",
                        "--out", "{dir}/s.csv"],
                       "input Parquet not found: {nope}"),
    "score": (["score", "{nope}", "{file}", "--out", "{dir}/s.csv"],
              "export folder not found: {nope}"),
    "plan --data": (["plan", "--data", "{nope}", "--ps", "2"],
                    "{nope} does not exist"),
    "embeddings stats": (["embeddings", "stats", "{nope}"],
                         "checkpoint '{nope}' does not exist"),
    "spec infer": (["spec", "infer", "{nope}", "--label", "y", "--out",
                    "{dir}/s.yaml"], "input Parquet not found: {nope}"),
    "ingest csv": (["ingest", "csv", "{nope}", "--out", "{dir}/o"],
                   "input file not found: {nope}"),
    "ingest movielens": (["ingest", "movielens", "{nope}", "--out",
                          "{dir}/o"], "folder not found: {nope}"),
}


@pytest.mark.parametrize("case", sorted(_MISSING))
def test_a_missing_path_is_one_line_without_tensorflow(case, tmp_path):
    argv, message = _MISSING[case]
    (tmp_path / "rows.parquet").write_bytes(b"")  # exists; never read
    names = {"nope": str(tmp_path / "nope"), "file": str(
        tmp_path / "rows.parquet"), "dir": str(tmp_path)}
    argv = [a.format(**names) for a in argv]
    code, tensorflow, err, _ = _psrec(argv, tmp_path)
    command = " ".join(argv[:1])
    assert code == 2, err
    assert len(err) == 1, err
    assert err[0].startswith(f"psrec {command}: error: "), err
    assert message.format(**names) in err[0], err
    assert not tensorflow, f"psrec {' '.join(argv)} imported tensorflow"


def test_ingest_csv_and_spec_infer_run_without_tensorflow(tmp_path):
    """A CSV to Parquet, then a spec from it, progress bars drawn: neither
    imports TensorFlow."""
    rows = "".join(f"{i % 2},{i % 7},u{i % 5}\n" for i in range(400))
    (tmp_path / "log.csv").write_text("click,n,user\n" + rows)
    code, tensorflow, err, out = _psrec(
        ["ingest", "csv", "log.csv", "--out", "pq", "--types",
         "click=int64,n=int64"], tmp_path)
    assert code == 0 and not tensorflow, err
    assert "400 rows in 1 parquet file" in out
    assert "ingest 1 file (MiB)" in err
    assert err[-1].startswith("1/1 [==============================]"), err
    code, tensorflow, err, out = _psrec(
        ["spec", "infer", "pq", "--label", "click", "--out", "spec.yaml"],
        tmp_path)
    assert code == 0 and not tensorflow, err
    assert (tmp_path / "spec.yaml").is_file()
    assert "spec infer: statistics (rows)" in err
    assert err[-1].startswith("400/400 [==============================]")
