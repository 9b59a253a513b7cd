"""The local run-state folder of a job: where the files that only this
machine's processes share go -- the coordinator's heartbeat, the
supervisor's ``cluster.json``, the local cluster's role logs.

With a local ``--workdir`` it is the workdir itself (nothing moves). With a
remote one (``gs://``, ``ram://``...) those files stay on the local disk,
under ``$PSREC_RUN_STATE_DIR`` when set, else
``<tmp>/psrec-run-state/<scheme>/<bucket and path>``: the same folder for
every process of the job on this machine (a restarted coordinator finds its
supervisor's heartbeat), and never a remote write every second.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from psrec.uri import is_uri
from psrec.uri import local
from psrec.uri import scheme
from psrec.uri import split_root

STATE_ENV = "PSREC_RUN_STATE_DIR"


def run_state_dir(workdir: object) -> Path:
    """The local folder for ``workdir``'s run state (see the module)."""
    if not is_uri(workdir):
        return Path(local(workdir))
    base = os.environ.get(STATE_ENV) or os.path.join(
        tempfile.gettempdir(), "psrec-run-state")
    rest = split_root(str(workdir))[1]
    parts = [re.sub(r"[^A-Za-z0-9._-]", "_", p)
             for p in rest.split("/") if p not in ("", ".", "..")]
    return Path(base, scheme(workdir), *parts)
