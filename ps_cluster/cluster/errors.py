"""Errors of the PS training core."""

from psrec.errors import RetryableError


class ClusterUnavailableError(RetryableError):
    """A PS task (or the whole cluster) became unreachable. Retryable: the
    PS tasks and the coordinator must be restarted, and training resumes
    from the latest checkpoint (TF cannot recover a lost PS in-process)."""
