"""The one place where psrec prepares the process environment for TensorFlow.

Every entry point (the ``psrec`` CLI, the role servers it spawns, the
benchmarks and the test suite) calls :func:`configure_environment` before
TensorFlow is imported for the first time. Nothing here runs at import time.

Why these variables:

* ``TF_USE_LEGACY_KERAS=1`` -- TF 2.21's default ``tf.keras`` is Keras 3, which
  does not support ``ParameterServerStrategy``; TFRS 0.7.7 refuses to import
  under it. The variable must be set before TensorFlow's first import.
* ``GRPC_FAIL_FAST=use_caller`` -- without it a lost peer can hang the cluster
  instead of raising (TF's PS tutorial; tensorflow/community RFC 355).
* ``TF_CPP_MIN_LOG_LEVEL`` -- keeps C++ info logs out of the progress output
  (only a default; a user's own value wins).

The C++ start-up lines TensorFlow prints before its logging is set up (absl,
oneDNN, the CUDA probes) ignore that variable: :func:`quiet_tensorflow_start_up`
filters them out of the first ``import tensorflow`` of a process.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import re
import sys
import tempfile
import warnings

_REQUIRED = {
    "TF_USE_LEGACY_KERAS": "1",
    "GRPC_FAIL_FAST": "use_caller",
}
_DEFAULTS = {
    "TF_CPP_MIN_LOG_LEVEL": "3",
}


def configure_environment() -> None:
    """Sets the variables TensorFlow must see before its first import.

    Raises:
      RuntimeError: if TensorFlow was already imported with a different
        ``TF_USE_LEGACY_KERAS`` value (then the setting can no longer apply).
    """
    if "tensorflow" in sys.modules and os.environ.get(
        "TF_USE_LEGACY_KERAS"
    ) != "1":
        raise RuntimeError(
            "TensorFlow was imported before psrec could set "
            "TF_USE_LEGACY_KERAS=1; call psrec.runtime.configure_environment() "
            "before importing tensorflow (or export TF_USE_LEGACY_KERAS=1)."
        )
    os.environ.update(_REQUIRED)
    for key, value in _DEFAULTS.items():
        os.environ.setdefault(key, value)


def role_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for a child role process (ps/worker/coordinator), from
    ``base`` (default: this process's)."""
    env = dict(os.environ if base is None else base)
    env.update(_REQUIRED)
    for key, value in _DEFAULTS.items():
        env.setdefault(key, value)
    return env


# TensorFlow's C++ start-up lines: printed on stderr while ``tensorflow`` is
# first imported, whatever TF_CPP_MIN_LOG_LEVEL says (absl logs before it is
# initialised): absl's notice itself, the oneDNN note, the CUDA probes of a
# machine without a GPU driver, the CPU-feature note.
_START_UP_NOISE = re.compile(
    rb"^(WARNING: All log messages before absl::InitializeLog\(\) is called "
    rb"are written to STDERR"
    rb"|[IW]\d{4} [\d:.]+ +\d+ (port|cudart_stub|cuda_executor|cuda_dnn|"
    rb"cuda_fft|cuda_blas|cpu_feature_guard|cpu_utils)\.cc:\d+\] "
    rb"|To enable the following instructions: .* rebuild TensorFlow with the "
    rb"appropriate compiler flags\.$)")


def start_up_lines_kept(text: bytes) -> bytes:
    """``text`` (what the import printed on stderr) without the lines of
    :data:`_START_UP_NOISE`; every other line is kept, in order."""
    return b"".join(line for line in text.splitlines(keepends=True)
                    if not _START_UP_NOISE.match(line))


class _QuietLoader:
    """The loader of ``tensorflow`` with stderr (file descriptor 2) sent to
    a file while the package runs, then the lines TensorFlow's C++ start-up
    prints dropped and the rest written on: the C++ libraries write on the
    descriptor, below Python's ``sys.stderr``."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def __getattr__(self, name: str):
        return getattr(self._loader, name)

    def exec_module(self, module) -> None:
        sys.stderr.flush()
        saved = os.dup(2)
        with tempfile.TemporaryFile() as capture:
            os.dup2(capture.fileno(), 2)
            try:
                self._loader.exec_module(module)
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                capture.seek(0)
                kept = start_up_lines_kept(capture.read())
                if kept:
                    os.write(2, kept)


class _QuietFinder(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` once, with a :class:`_QuietLoader`, and leaves
    ``sys.meta_path``."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


def quiet_tensorflow_start_up() -> None:
    """Makes this process's first ``import tensorflow`` drop TensorFlow's
    C++ start-up lines from stderr (:func:`start_up_lines_kept`; the lines
    TF_CPP_MIN_LOG_LEVEL cannot silence), and ignores tf.data's warning
    about options read in graph mode. Nothing changes when TensorFlow
    is already imported, or when TF_CPP_MIN_LOG_LEVEL is 0: the user asked
    for TensorFlow's logs."""
    # Raised inside TensorFlow (a dataset's options read in graph mode by
    # its own distribution code), once per run; nothing for a user to do.
    warnings.filterwarnings(
        "ignore", "To make it possible to preserve tf.data options across "
        "serialization boundaries", UserWarning)
    if "tensorflow" in sys.modules or os.environ.get(
            "TF_CPP_MIN_LOG_LEVEL") == "0":
        return
    if not any(isinstance(f, _QuietFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietFinder())
