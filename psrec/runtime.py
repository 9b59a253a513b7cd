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
"""

from __future__ import annotations

import os
import sys

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
