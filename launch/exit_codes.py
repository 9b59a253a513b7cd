"""Exit codes of ``psrec``, following Kubeflow's retryable/permanent split
(``IsRetryableExitCode``: 130, 137, 143 and 138 retryable; 1, 2, 126, 127,
128, 139 permanent).

=====  =========  ==========================================================
code   kind       meaning
=====  =========  ==========================================================
0      --         success
1      permanent  the job failed on its input: bad rows above the limit,
                  corrupted records, a checkpoint that does not restore
2      permanent  bad arguments, spec, manifest or cluster spec
130    retryable  interrupted (SIGINT / Ctrl-C)
137    retryable  killed (SIGKILL, e.g. out of memory or preempted)
138    retryable  psrec's own retryable failure: a PS or the cluster became
                  unreachable, the stall watchdog fired, a role did not start
143    retryable  terminated (SIGTERM)
=====  =========  ==========================================================
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_RETRYABLE = 138
EXIT_TERMINATED = 143

RETRYABLE = frozenset({130, 137, 138, 143})


def is_retryable(code: int) -> bool:
    """True for codes a supervisor should retry; a negative code is a
    process killed by a signal (Popen's convention): retryable."""
    return code < 0 or code in RETRYABLE
