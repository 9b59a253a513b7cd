"""TF Serving warmup requests of an export (``assets.extra/
tf_serving_warmup_requests``).

TF Serving (``--enable_model_warmup``, on by default) replays the
``PredictionLog`` records of this TFRecord file when it loads a model
version, so the first real requests do not pay for graph tracing, lookup
table initialisation and memory allocation. psrec writes a few Predict
requests for ``serving_default`` whose inputs are raw feature tensors in
the serving contract (:mod:`psrec.models.serving.export`): one request with a
single row and one with every warmup row, so both the batch-of-one path
and a batched path are warm. TF Serving replays at most 1000 records; psrec
writes two. A retrieval export's requests hold the query features only
(the inputs of its top-K model and of its query tower).

The messages are TF Serving's own (``tensorflow-serving-api``:
``tensorflow_serving.apis.prediction_log_pb2``); their ``TensorProto`` is
TensorFlow's, what :func:`tf.make_tensor_proto` returns.
"""

from __future__ import annotations

import dataclasses
import os
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from psrec.data.format.manifest import Manifest
from psrec.data.ingest.synthetic import synthetic_table
from psrec.data.input.dataset import make_eval_dataset
from psrec.features.spec.spec import ID_COLUMN
from psrec.features.spec.spec import FeatureSpec
from psrec.models.serving.export import serving_signature
from psrec.models.serving.scoring import serving_batch

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
SIGNATURE = "serving_default"


def predict_log(inputs: dict[str, np.ndarray], model_name: str) -> bytes:
    """One serialized ``PredictionLog`` holding a ``PredictLog`` whose
    request asks ``serving_default`` of ``model_name`` for ``inputs``."""
    log = prediction_log_pb2.PredictionLog()
    request = log.predict_log.request
    request.model_spec.name = model_name
    request.model_spec.signature_name = SIGNATURE
    for name, values in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(values))
    return log.SerializeToString()


def write_warmup(version_dir: str, inputs: dict[str, np.ndarray],
                 model_name: str) -> str:
    """Writes the warmup file into an export's version folder; returns its
    path.

    Args:
      inputs: the raw serving inputs of the warmup rows (``[rows]`` or
        ``[rows, n]`` arrays, as ``serving_default`` takes them).
      model_name: the name requests carry (TF Serving's ``--model_name``;
        it answers warmup requests whatever name they carry).
    """
    rows = len(next(iter(inputs.values())))
    path = os.path.join(version_dir, WARMUP_FILE)
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.TFRecordWriter(path) as writer:
        for count in sorted({1, rows}):
            head = {name: values[:count] for name, values in inputs.items()}
            writer.write(predict_log(head, model_name))
    return path


def read_warmup(version_dir: str) -> list[dict[str, np.ndarray]]:
    """The inputs of each request in an export's warmup file, in order
    (what TF Serving would send to ``serving_default``).

    Raises:
      ValueError: a record is not a Predict request for
        ``serving_default``.
    """
    path = os.path.join(version_dir, WARMUP_FILE)
    requests = []
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        log = prediction_log_pb2.PredictionLog.FromString(record)
        if log.WhichOneof("log_type") != "predict_log":
            raise ValueError(f"{path}: a {log.WhichOneof('log_type')} "
                             "record, not a Predict request")
        request = log.predict_log.request
        if request.model_spec.signature_name != SIGNATURE:
            raise ValueError(f"{path}: a request for signature "
                             f"{request.model_spec.signature_name!r}")
        requests.append({name: tf.make_ndarray(tensor)
                         for name, tensor in request.inputs.items()})
    return requests


# A converted example keeps its row id (``psrec__id``: the 0-based position
# over the conversion's input files, in order), and the manifest lists those
# inputs with their row counts: so the first eval examples lead back to their
# raw Parquet rows, sent as a serving client sends them (the contract of
# :mod:`psrec.models.serving.scoring`). Synthetic rows (no manifest, inputs
# gone, no eval split) still warm every op, only with made-up values.

WARMUP_ROWS = 8


@dataclasses.dataclass(frozen=True)
class WarmupRows:
    """Raw serving inputs of the warmup rows (as ``serving_default`` takes
    them) and where they came from.

    Attributes:
      source: ``"eval rows <ids> of <manifest>"`` or ``"synthetic rows
        (<why>)"``.
      ids: the eval rows' ids (empty for synthetic rows).
    """

    inputs: dict[str, np.ndarray]
    source: str
    ids: tuple[int, ...] = ()


def _first_eval_ids(manifest: Manifest, spec: FeatureSpec,
                    rows: int) -> np.ndarray:
    files = [str(manifest.path_of(shard.file))
             for shard in manifest.shards.get("eval", ()) if shard.rows]
    if not files:
        raise LookupError("the data has no eval split")
    dataset = make_eval_dataset(files[:1], spec, rows, manifest.block_rows)
    batch = next(iter(dataset))
    return np.sort(batch[ID_COLUMN].numpy()[:rows])


def _source_rows(manifest: Manifest, ids: np.ndarray,
                 columns: list[str]) -> pa.Table:
    """The raw rows with global row ids ``ids`` (sorted), read one row
    group at a time from the manifest's input files."""
    counts = [int(source["rows"]) for source in manifest.sources]
    starts = np.cumsum([0, *counts[:-1]])
    wanted = defaultdict(list)
    for row in ids:
        index = int(np.searchsorted(starts, row, side="right")) - 1
        wanted[index].append(int(row - starts[index]))
    pieces = []
    for index, local_rows in sorted(wanted.items()):
        parquet = pq.ParquetFile(manifest.sources[index]["file"])
        group_starts = np.cumsum([0] + [
            parquet.metadata.row_group(g).num_rows
            for g in range(parquet.metadata.num_row_groups)])
        groups = {}  # each row group read once, however many rows it has
        for row in local_rows:
            group = int(np.searchsorted(group_starts, row, side="right")) - 1
            if group not in groups:
                groups[group] = parquet.read_row_group(group, columns=columns)
            pieces.append(groups[group].slice(row - int(group_starts[group]),
                                              1))
    return pa.concat_tables(pieces, promote_options="permissive")


def _inputs(table: pa.Table, spec: FeatureSpec) -> dict[str, np.ndarray]:
    batch = table.combine_chunks().to_batches()[0]
    return serving_batch(batch, serving_signature(spec))


def warmup_rows(spec: FeatureSpec, manifest: Manifest | None,
                rows: int = WARMUP_ROWS, *,
                serving_spec: FeatureSpec | None = None) -> WarmupRows:
    """The first ``rows`` eval rows of ``manifest`` in their raw form, or
    ``rows`` synthetic rows when they cannot be read (None: no manifest).

    Args:
      spec: the spec the data was converted with.
      serving_spec: the spec whose raw inputs the export's
        ``serving_default`` takes (a retrieval export's: the query tower's,
        :func:`psrec.models.serving.retrieval_export.query_spec`); None:
        ``spec``.
    """
    serving_spec = serving_spec or spec
    why = "no manifest"
    if manifest is not None:
        try:
            ids = _first_eval_ids(manifest, spec, rows)
            table = _source_rows(manifest, ids,
                                 list(serving_spec.raw_inputs))
            ids_text = ", ".join(str(i) for i in ids)
            return WarmupRows(
                _inputs(table, serving_spec),
                f"eval rows {ids_text} of {manifest.root / 'manifest.json'}",
                tuple(int(i) for i in ids))
        except (LookupError, StopIteration, OSError,
                pa.ArrowException, tf.errors.OpError) as error:
            why = f"{type(error).__name__}: {error}".splitlines()[0]
    table = synthetic_table(spec, rows, seed=0)
    return WarmupRows(_inputs(table, serving_spec),
                      f"synthetic rows ({why})")
