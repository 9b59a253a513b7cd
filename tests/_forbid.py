"""Running ``psrec`` commands in-process with the work they would start
forbidden: a refusal that must come before any server (or before the data)
is tested by calling ``main([...])`` in the test's process, which raises
:class:`Reached` if the command gets past the point it must stop at.

Each seam is replaced wherever it is bound -- in its own module and in
every loaded ``psrec`` module that imported the name -- so the tests do not
depend on whether a command imports it at the top or at call time.
"""

from __future__ import annotations

import importlib
import sys

#: The seams, in the order ``psrec train`` reaches them: data preparation
#: (checksums, repair, splits), the local servers, the supervisor, the
#: coordinator's job, the local multi-worker-mirrored workers.
DATA = ("psrec.launch.job.data", "prepare_data")
SERVERS = (("psrec.launch.local.cluster", "LocalCluster"),
           ("psrec.launch.supervise.supervisor", "supervise"),
           ("psrec.launch.job.run", "run_job"),
           ("psrec.launch.job.local_workers", "run_local_workers"))


class Reached(AssertionError):
    """A forbidden seam was called: the command went on past its checks."""


def forbid(monkeypatch, *, data: bool = True) -> list:
    """Makes every seam of :data:`SERVERS` (and with ``data`` also
    :data:`DATA`) raise :class:`Reached`; returns the list of the first
    arguments they were called with (the job's config, for each seam of
    ``psrec train``)."""
    seams = SERVERS + ((DATA,) if data else ())
    seen = []
    for module_name, name in seams:
        module = importlib.import_module(module_name)
        original = getattr(module, name)

        def reached(*args, _what=f"{module_name}.{name}", **kwargs):
            seen.append(args[0] if args else None)
            raise Reached(f"the command reached {_what}")

        for loaded in list(sys.modules.values()):
            if (getattr(loaded, "__name__", "").startswith("psrec")
                    and getattr(loaded, name, None) is original):
                monkeypatch.setattr(loaded, name, reached)
    return seen


__all__ = ["DATA", "Reached", "SERVERS", "forbid"]
