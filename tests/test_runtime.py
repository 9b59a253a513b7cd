"""The process environment for TensorFlow (``psrec/runtime.py``): the
first ``import tensorflow`` of a psrec process prints none of TensorFlow's
C++ start-up lines, and nothing else it prints is lost."""

from __future__ import annotations

import os
import subprocess
import sys

from psrec import runtime

NOISE = (
    b"WARNING: All log messages before absl::InitializeLog() is called are "
    b"written to STDERR\n"
    b"I0000 00:00:1796233355.630338    7479 port.cc:153] oneDNN custom "
    b"operations are on.\n"
    b"I0000 00:00:1796233355.631166    7479 cudart_stub.cc:31] Could not find "
    b"cuda drivers on your machine, GPU will not be used.\n"
    b"I0000 00:00:1796235280.629286   21213 cpu_feature_guard.cc:227] This "
    b"TensorFlow binary is optimized to use available CPU instructions in "
    b"performance-critical operations.\n"
    b"To enable the following instructions: AVX2 FMA, in other operations, "
    b"rebuild TensorFlow with the appropriate compiler flags.\n")


def test_only_the_start_up_lines_are_dropped():
    kept = (b"E0000 00:00:1.0 12 some_op.cc:9] a real error\n"
            b"Traceback (most recent call last):\n")
    assert runtime.start_up_lines_kept(NOISE + kept + NOISE) == kept
    assert runtime.start_up_lines_kept(NOISE) == b""


def test_the_loader_passes_on_what_is_not_start_up_noise(capfd):
    class Loud:
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            os.write(2, NOISE + b"a line the user must see\n")

    runtime._QuietLoader(Loud()).exec_module(None)
    assert capfd.readouterr().err == "a line the user must see\n"


def _import_tensorflow(env: dict[str, str]) -> str:
    code = ("from psrec.launch.cli.main import start_process\n"
            "start_process()\n"
            "import tensorflow as tf\n"
            "print(tf.constant(2).numpy() * 3)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, env=env, timeout=120, check=True)
    assert done.stdout.strip() == "6"
    return done.stderr


def test_a_psrec_process_imports_tensorflow_quietly():
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    assert _import_tensorflow(env) == ""
    # TF_CPP_MIN_LOG_LEVEL=0 asks for TensorFlow's logs: they are kept
    assert "InitializeLog" in _import_tensorflow(
        {**env, "TF_CPP_MIN_LOG_LEVEL": "0"})
