"""TensorFlow errors of a training job turned into psrec errors with exit
codes (``psrec.errors``): a lost or reset task is retryable, a corrupted
record names its file."""

from __future__ import annotations

import contextlib
from typing import Iterator

from psrec.data.manifest import Manifest
from psrec.errors import one_line
from psrec.ps_cluster.tf_config import ClusterSpec


@contextlib.contextmanager
def translated_errors(manifest: Manifest, cluster: ClusterSpec | None = None
                      ) -> Iterator[None]:
    """TF errors from the cluster -> psrec errors with exit codes: a lost
    task is retryable (named after probing each task), a corrupted record
    names its file."""
    import tensorflow as tf

    from psrec.data.records import corruption_named
    from psrec.launch.cluster_probe import lost_task_message
    from psrec.ps_cluster.errors import ClusterUnavailableError
    try:
        with corruption_named(manifest.files("train")
                              + manifest.files("eval")):
            yield
    except (tf.errors.UnavailableError, tf.errors.AbortedError,
            tf.errors.CancelledError) as error:
        raise ClusterUnavailableError(
            f"the cluster became unreachable ({type(error).__name__}: "
            f"{one_line(error)[:600]}); "
            f"{lost_task_message(cluster)}. Restart the lost task(s); a lost "
            "PS also needs the coordinator rerun (it resumes from the latest "
            "checkpoint).") from error
    except tf.errors.OutOfRangeError as error:
        if "IteratorGetNext" not in str(error):
            raise
        # The training stream repeats forever: an end means a worker's
        # iterator was lost (measured right after a PS partition healed, on
        # a worker the previous coordinator had used).
        raise ClusterUnavailableError(
            f"a worker's input iterator ended ({one_line(error)[:300]}); "
            "rerun: it resumes from the latest checkpoint.") from error
    except tf.errors.FailedPreconditionError as error:
        if _LOST_FUNCTIONS not in str(error):
            raise
        raise ClusterUnavailableError(  # a reset connection, not the input
            f"a worker lost its functions ({one_line(error)[:300]}): its "
            "connection was reset (a network partition?); rerun: it resumes "
            "from the latest checkpoint.") from error


# What a worker whose gRPC connection was reset (a partition of ~30 s) says
# when the next function runs there (measured with a 30 s link cut between
# network namespaces, as tests/test_multihost.py makes them).
_LOST_FUNCTIONS = "Could not find required function definition"
