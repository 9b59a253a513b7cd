"""Warmup files read back with TF Serving's own protos
(``tensorflow_serving.apis``, psrec's code not involved) and checked
against the export's ``serving_default``, shared by the export tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

WARMUP = Path("assets.extra") / "tf_serving_warmup_requests"


def official_requests(saved_model: str | Path, model_name: str
                      ) -> list[dict[str, np.ndarray]]:
    """The inputs of each record of ``saved_model``'s warmup file, parsed
    as ``tensorflow.serving.PredictionLog``; asserts each is a Predict
    request for ``serving_default`` of ``model_name`` whose inputs are
    those of the SavedModel's ``serving_default`` (names, dtypes, ranks)
    and have one batch size."""
    signature = tf.saved_model.load(str(saved_model)).signatures[
        "serving_default"]
    _, wanted = signature.structured_input_signature
    requests = []
    for record in tf.data.TFRecordDataset(
            str(Path(saved_model) / WARMUP)).as_numpy_iterator():
        log = prediction_log_pb2.PredictionLog.FromString(record)
        assert log.WhichOneof("log_type") == "predict_log"
        request = log.predict_log.request
        assert request.model_spec.name == model_name
        assert request.model_spec.signature_name == "serving_default"
        assert sorted(request.inputs) == sorted(wanted)
        inputs = {}
        for name, tensor in request.inputs.items():
            assert tf.dtypes.as_dtype(tensor.dtype) == wanted[name].dtype, name
            inputs[name] = tf.make_ndarray(tensor)
            assert inputs[name].ndim == wanted[name].shape.rank, name
        assert len({len(v) for v in inputs.values()}) == 1, inputs
        requests.append(inputs)
    return requests


def serve(saved_model: str | Path, inputs: dict[str, np.ndarray]
          ) -> dict[str, np.ndarray]:
    """``saved_model``'s ``serving_default`` on ``inputs`` (what TF Serving
    does with a warmup request)."""
    signature = tf.saved_model.load(str(saved_model)).signatures[
        "serving_default"]
    outputs = signature(**{k: tf.constant(v) for k, v in inputs.items()})
    return {k: v.numpy() for k, v in outputs.items()}
