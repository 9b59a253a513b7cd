"""psrec.errors.one_line: a TensorFlow error reduced to its informative
lines (the first line alone can be just "Graph execution error:")."""

import tensorflow as tf

from psrec.errors import one_line

# The shape of a real UnavailableError from a closure whose PS went away.
_MESSAGE = """Graph execution error:

Detected at node 'ReadVariableOp' defined at (most recent call last):
<stack traces unavailable>
Detected at node 'ReadVariableOp' defined at (most recent call last):
<stack traces unavailable>
2 root error(s) found.
  (0) UNAVAILABLE:  failed to connect to all addresses; last error: \
UNKNOWN: ipv4:127.0.0.1:40185: Failed to connect to remote host: \
Connection refused
"""


def test_a_tf_error_keeps_its_cause_and_drops_the_stubs():
    error = tf.errors.UnavailableError(None, None, _MESSAGE)
    line = one_line(error)
    assert "\n" not in line
    assert "Connection refused" in line and "127.0.0.1:40185" in line
    assert "Graph execution error" not in line
    assert "Detected at node" not in line and "stack traces" not in line
    assert line.startswith("2 root error(s) found.")


def test_a_plain_error_is_its_message_or_its_type():
    assert one_line(ValueError("bad\nvalue")) == "bad value"
    assert one_line(RuntimeError()) == "RuntimeError"


class _NoFiles:
    @staticmethod
    def files(split: str) -> list[str]:
        return []


def test_a_worker_that_lost_its_functions_is_retryable_not_permanent():
    import pytest

    from psrec.errors import RetryableError
    from psrec.launch.job.run import translated_errors
    lost = tf.errors.FailedPreconditionError(
        None, None, "Could not find required function definition "
        "__inference_evaluate_shard_1234")
    with pytest.raises(RetryableError, match="lost its functions") as caught:
        with translated_errors(_NoFiles()):
            raise lost
    assert caught.value.exit_code == 138
    other = tf.errors.FailedPreconditionError(None, None, "disk is full")
    with pytest.raises(tf.errors.FailedPreconditionError):
        with translated_errors(_NoFiles()):
            raise other


def test_an_ended_training_iterator_is_retryable():
    import pytest

    from psrec.errors import RetryableError
    from psrec.launch.job.run import translated_errors
    ended = tf.errors.OutOfRangeError(
        None, None, "End of sequence\n\t [[{{node while/IteratorGetNext}}]]")
    with pytest.raises(RetryableError, match="iterator ended"):
        with translated_errors(_NoFiles()):
            raise ended
