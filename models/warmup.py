"""TF Serving warmup requests of an export (``assets.extra/
tf_serving_warmup_requests``).

TF Serving (``--enable_model_warmup``, on by default) replays the
``PredictionLog`` records of this TFRecord file when it loads a model
version, so the first real requests do not pay for graph tracing, lookup
table initialisation and memory allocation. psrec writes a few Predict
requests for ``serving_default`` whose inputs are raw feature tensors in
the serving contract (:mod:`psrec.models.export`): one request with a
single row and one with every warmup row, so both the batch-of-one path
and a batched path are warm. TF Serving replays at most 1000 records; psrec
writes two.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from psrec.models.serving_protos import message_classes

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
SIGNATURE = "serving_default"


def predict_log(inputs: dict[str, np.ndarray], model_name: str) -> bytes:
    """One serialized ``PredictionLog`` holding a ``PredictLog`` whose
    request asks ``serving_default`` of ``model_name`` for ``inputs``."""
    classes = message_classes()
    log = classes["PredictionLog"]()
    request = log.predict_log.request
    request.model_spec.name = model_name
    request.model_spec.signature_name = SIGNATURE
    for name, values in inputs.items():
        # TensorProto crosses descriptor pools as bytes (same schema).
        request.inputs[name].MergeFromString(
            tf.make_tensor_proto(values).SerializeToString())
    return log.SerializeToString()


def _head(inputs: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    return {name: values[:rows] for name, values in inputs.items()}


def write_warmup(version_dir: str, inputs: dict[str, np.ndarray],
                 model_name: str) -> str:
    """Writes the warmup file into an export's version folder.

    Args:
      inputs: the raw serving inputs of the warmup rows (``[rows]`` or
        ``[rows, n]`` arrays, as ``serving_default`` takes them).
      model_name: the name requests carry (TF Serving's ``--model_name``;
        it answers warmup requests whatever name they carry).

    Returns:
      The file's path.
    """
    rows = len(next(iter(inputs.values())))
    path = os.path.join(version_dir, WARMUP_FILE)
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.TFRecordWriter(path) as writer:
        for count in sorted({1, rows}):
            writer.write(predict_log(_head(inputs, count), model_name))
    return path


def read_warmup(version_dir: str) -> list[dict[str, np.ndarray]]:
    """The inputs of each request in an export's warmup file, in order
    (what TF Serving would send to ``serving_default``).

    Raises:
      ValueError: a record is not a Predict request for
        ``serving_default``.
    """
    classes = message_classes()
    tensor_proto = type(tf.make_tensor_proto(0.0))  # TensorFlow's class
    path = os.path.join(version_dir, WARMUP_FILE)
    requests = []
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        log = classes["PredictionLog"].FromString(record)
        request = log.predict_log.request
        if request.model_spec.signature_name != SIGNATURE:
            raise ValueError(f"{path}: a request for signature "
                             f"{request.model_spec.signature_name!r}")
        requests.append({
            name: tf.make_ndarray(tensor_proto.FromString(
                tensor.SerializeToString()))
            for name, tensor in request.inputs.items()})
    return requests
