"""Test-suite setup: the TensorFlow environment is configured once, here,
through the same function every psrec entry point uses."""

from launch.runtime import configure_environment

configure_environment()
