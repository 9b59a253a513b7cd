"""The few TensorFlow Serving messages a warmup file needs, defined here.

TF Serving reads ``assets.extra/tf_serving_warmup_requests`` as a TFRecord
file of ``tensorflow.serving.PredictionLog`` messages. Their Python classes
ship in ``tensorflow-serving-api``, which pins an exact TensorFlow version,
so psrec declares the messages itself -- the parts a Predict warmup uses,
with the field numbers of the real ``.proto`` files (any field left out is
simply absent on the wire, which proto3 reads as unset):

* ``tensorflow_serving/apis/model.proto``: ``ModelSpec { string name = 1;
  string signature_name = 3; }``;
* ``tensorflow_serving/apis/predict.proto``: ``PredictRequest { ModelSpec
  model_spec = 1; map<string, TensorProto> inputs = 2; }``;
* ``tensorflow_serving/apis/prediction_log.proto``: ``PredictLog {
  PredictRequest request = 1; }`` and ``PredictionLog { oneof log_type {
  PredictLog predict_log = 6; } }``.

``TensorProto`` is TensorFlow's own (``tensorflow/core/framework/
tensor.proto``, what :func:`tf.make_tensor_proto` returns). The messages
live in a private descriptor pool, so they never clash with the real
classes if ``tensorflow-serving-api`` is imported in the same process.
"""

from __future__ import annotations

import functools

import tensorflow as tf
from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool
from google.protobuf import message_factory

PACKAGE = "tensorflow.serving"
_FILE = "psrec/tf_serving_warmup.proto"
_TENSOR = ".tensorflow.TensorProto"
_F = descriptor_pb2.FieldDescriptorProto

# (message, [(field, number, type, message type or None, label)]); the
# numbers are those of the TF Serving protos named in the module docstring.
_MESSAGES = (
    ("ModelSpec", [("name", 1, _F.TYPE_STRING, None),
                   ("signature_name", 3, _F.TYPE_STRING, None)]),
    ("PredictRequest", [("model_spec", 1, _F.TYPE_MESSAGE,
                         f".{PACKAGE}.ModelSpec")]),
    ("PredictLog", [("request", 1, _F.TYPE_MESSAGE,
                     f".{PACKAGE}.PredictRequest")]),
    ("PredictionLog", [("predict_log", 6, _F.TYPE_MESSAGE,
                        f".{PACKAGE}.PredictLog")]),
)


def _add_file(pool: descriptor_pool.DescriptorPool, file) -> None:
    """Adds a generated file descriptor (and its imports first) to
    ``pool`` unless it is there already."""
    try:
        pool.FindFileByName(file.name)
        return
    except KeyError:
        pass
    for dependency in file.dependencies:
        _add_file(pool, dependency)
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(file.serialized_pb))


def _field(message: descriptor_pb2.DescriptorProto, name: str, number: int,
           kind: int, type_name: str | None,
           label: int = _F.LABEL_OPTIONAL) -> None:
    field = message.field.add(name=name, number=number, type=kind,
                              label=label)
    if type_name:
        field.type_name = type_name


def _inputs_map(request: descriptor_pb2.DescriptorProto) -> None:
    """``map<string, TensorProto> inputs = 2``: on the wire a repeated
    ``InputsEntry { string key = 1; TensorProto value = 2; }``."""
    entry = request.nested_type.add(name="InputsEntry")
    entry.options.map_entry = True
    _field(entry, "key", 1, _F.TYPE_STRING, None)
    _field(entry, "value", 2, _F.TYPE_MESSAGE, _TENSOR)
    _field(request, "inputs", 2, _F.TYPE_MESSAGE,
           f".{PACKAGE}.PredictRequest.InputsEntry", _F.LABEL_REPEATED)


@functools.lru_cache(maxsize=1)
def message_classes() -> dict[str, type]:
    """``{"ModelSpec"|"PredictRequest"|"PredictLog"|"PredictionLog":
    message class, "TensorProto": the pool's copy of TensorFlow's}``."""
    pool = descriptor_pool.DescriptorPool()
    tensor_file = tf.make_tensor_proto(0.0).DESCRIPTOR.file
    _add_file(pool, tensor_file)
    proto = descriptor_pb2.FileDescriptorProto(
        name=_FILE, package=PACKAGE, syntax="proto3",
        dependency=[tensor_file.name])
    for name, fields in _MESSAGES:
        message = proto.message_type.add(name=name)
        for field in fields:
            _field(message, *field)
        if name == "PredictRequest":
            _inputs_map(message)
    pool.Add(proto)
    names = [name for name, _ in _MESSAGES]
    classes = {name: message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"{PACKAGE}.{name}")) for name in names}
    classes["TensorProto"] = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("tensorflow.TensorProto"))
    return classes
