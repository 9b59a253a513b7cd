"""psrec's error hierarchy: every error a user can cause carries its exit code.

The CLI prints ``psrec: <message>`` and exits with ``error.exit_code``; no
traceback is shown for any of these. Exit codes follow Kubeflow's
retryable/permanent split (``IsRetryableExitCode``: 130, 137, 138 and 143
are retried; 1, 2 and everything below 128 are not):

=====  =========  ==========================================================
code   kind       meaning
=====  =========  ==========================================================
0      --         success
1      permanent  the job failed on its input or state: bad rows above the
                  limit, corrupted records, a checkpoint that does not restore
2      permanent  bad arguments, spec, manifest, cluster spec, or an
                  installation/configuration problem (never retried)
130    retryable  interrupted (SIGINT / Ctrl-C)
137    retryable  killed (SIGKILL, e.g. out of memory or preempted)
138    retryable  psrec's own retryable failure: a PS or the cluster became
                  unreachable, the stall watchdog fired, a role did not start
143    retryable  terminated (SIGTERM)
=====  =========  ==========================================================
"""

from __future__ import annotations

import difflib
import errno
import functools
import os

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_RETRYABLE = 138
EXIT_TERMINATED = 143

RETRYABLE_EXIT_CODES = frozenset({130, 137, 138, 143})


def is_retryable(code: int) -> bool:
    """True for exit codes a supervisor should retry; a negative code is a
    process killed by a signal (``Popen``'s convention): retryable."""
    return code < 0 or code in RETRYABLE_EXIT_CODES


class PsrecError(Exception):
    """Base of every error psrec reports to a user; ``exit_code`` says how
    an orchestrator should treat it."""

    exit_code: int = EXIT_FAILURE


class ConfigError(PsrecError, ValueError):
    """A bad argument, spec, manifest or cluster spec. The message names the
    option (or field), the value and what is allowed. Permanent (exit 2)."""

    exit_code = EXIT_USAGE


class DataError(PsrecError):
    """The job failed on its data or state (bad rows, corrupted records, a
    checkpoint that does not restore). Permanent (exit 1)."""

    exit_code = EXIT_FAILURE


class RetryableError(PsrecError):
    """A failure a restart can fix (a lost PS, a role that did not start,
    a stall). Retryable (exit 138)."""

    exit_code = EXIT_RETRYABLE


def check(ok: bool, name: str, value: object, allowed: str,
          error: type[PsrecError] = ConfigError) -> None:
    """Raises ``error("`name` = value allowed.")`` unless ``ok``: the one
    shape of every configuration check's message."""
    if not ok:
        end = "" if allowed.endswith("?") else "."
        raise error(f"`{name}` = {value!r} {allowed}{end}")


def check_at_least(config: object, low: int, *names: str,
                   error: type[PsrecError] = ConfigError) -> None:
    """Each named attribute of ``config`` is a number >= ``low`` (an error
    names it ``Class.name``)."""
    for name in names:
        value = getattr(config, name)
        check(value >= low, f"{type(config).__name__}.{name}", value,
              f"must be >= {low}", error)


def check_choice(name: str, value: object, choices: tuple,
                 error: type[PsrecError] = ConfigError) -> None:
    """``value`` is one of ``choices``."""
    check(value in choices, name, value,
          f"is not one of {', '.join(map(str, choices))}"
          f"{did_you_mean(value, choices)}", error)


def one_line(error: BaseException) -> str:
    """An error's message on one line. For a TensorFlow error, the lines
    that carry no information are dropped: its first line may say only
    "Graph execution error:", followed by per-node "Detected at node" stack
    stubs, and the cause comes after them."""
    lines = (getattr(error, "message", None) or str(error)).splitlines()
    kept = " ".join(line.strip() for line in lines if line.strip() and not (
        line.startswith("Detected at node") or "stack traces unavailable"
        in line or line.strip().endswith("error:")))
    return kept or type(error).__name__


@functools.cache
def _os_errors() -> list[tuple[str, str]]:
    """The OS errors a storage write reports (their strerror text, as
    TensorFlow's file systems put it in a status message), longest first so
    that no text matches inside a longer one (made at the first failure,
    not at import)."""
    return sorted(((os.strerror(code), name)
                   for code, name in errno.errorcode.items()
                   if not os.strerror(code).startswith("Unknown error")),
                  key=lambda pair: -len(pair[0]))


def os_error_cause(error: BaseException) -> str | None:
    """The operating system's reason in ``error``, as ``"Read-only file
    system (EROFS)"``: from an ``OSError``'s errno, or the strerror text a
    TensorFlow error carries somewhere in its (possibly long, flattened)
    message. None when it names no OS error."""
    if isinstance(error, OSError) and error.errno in errno.errorcode:
        return f"{os.strerror(error.errno)} ({errno.errorcode[error.errno]})"
    message = getattr(error, "message", None) or str(error)
    for text, name in _os_errors():
        if text in message:
            return f"{text} ({name})"
    return None


def did_you_mean(value: object, choices: object) -> str:
    """``"; did you mean 'x'?"`` for the choice closest to a misspelt
    ``value``, ``""`` when none is close: what every error refusing an
    unknown name from a closed set appends. A choice equal but for case
    wins (``c1`` -> ``C1``); else the closest by
    :func:`difflib.get_close_matches`, compared without case."""
    names = [str(c) for c in choices]
    text = str(value)
    folded = {}
    for name in names:
        folded.setdefault(name.casefold(), name)
    if text.casefold() in folded:
        close = [folded[text.casefold()]]
    else:
        close = [folded[c] for c in difflib.get_close_matches(
            text.casefold(), list(folded), n=1)]
    return f"; did you mean {close[0]!r}?" if close else ""
