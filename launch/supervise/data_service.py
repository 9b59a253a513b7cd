"""The local tf.data service process of ``psrec train``, kept alive.

The local launcher runs the tf.data service as one OS process (``psrec
data-server --role dispatcher --local-workers N``: the dispatcher and one
tf.data worker per training worker) on a fixed loopback port that the
coordinator and the training workers know; the supervisor restarts it
when it dies (:meth:`LocalDataService.keep`).

The dispatcher runs in fault-tolerant mode with its journal in the run
state folder (``data-service-journal``, emptied when the launcher starts,
so a rerun never joins the jobs of an earlier run): a restarted dispatcher
recovers its jobs and the training workers' iterators reconnect to it by
themselves (``tests/test_data_service.py``). What that guarantees, and
how a run without the journal fails: docs/reliability.md.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

from psrec.errors import RetryableError
from psrec.launch.local.cluster import psrec_command
from psrec.launch.local.cluster import spawn
from psrec.launch.local.cluster import stop_processes
from psrec.launch.local.cluster import wait_listening
from psrec.launch.supervise.failure import is_frozen
from psrec.launch.supervise.restart_policy import BUDGET_FLAGS
from psrec.ps_cluster.cluster.addresses import free_loopback_ports

START_TIMEOUT = 120.0  # seconds for the tf.data roles to listen
JOURNAL = "data-service-journal"


def _describe_exit(code: int) -> str:
    """``exit 3`` or ``signal SIGKILL`` for a ``Popen.returncode``."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit {code}"


class LocalDataService:
    """The one-process local tf.data service, restarted when it dies.

    Args:
      workers: tf.data workers to run beside the dispatcher (one per
        training worker).
      state_dir: the run state folder: ``logs/data-dispatcher.log`` and
        the dispatcher's journal go there.
      run_dir: the run's workdir (``psrec data-server --run-dir``).
    """

    def __init__(self, workers: int, state_dir: Path, run_dir: str,
                 log=print) -> None:
        self.workers = workers
        self.state_dir = Path(state_dir)
        self.run_dir = run_dir
        self.log = log
        self.port = free_loopback_ports(1)[0]
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def journal(self) -> Path:
        return self.state_dir / JOURNAL

    def start(self) -> None:
        """Starts the service with an empty journal; returns at once (the
        local cluster's roles start meanwhile): :meth:`wait_ready` blocks
        until the dispatcher listens."""
        shutil.rmtree(self.journal, ignore_errors=True)
        self._spawn()
        self.log(f"tf.data service: dispatcher {self.address} + "
                 f"{self.workers} tf.data workers, one process (data pid "
                 f"{self.process.pid}; journal {self.journal})")

    def keep(self, spend: Callable[[str, str], bool]) -> bool:
        """Restarts the service on its port when it has died (blocking
        until it listens again); True when it did. ``spend(role, why)``
        takes one restart from the ``data_service`` budget and logs the
        line (the supervisor's ``_spend``); False when it is spent, and
        then this raises a RetryableError."""
        if self.process is None or self.process.poll() is None:
            return False
        pid, how = self.process.pid, _describe_exit(self.process.returncode)
        if not spend("data_service",
                     f"tf.data service died (data pid {pid}, {how})"):
            raise RetryableError(
                f"the local tf.data service (data pid {pid}) died ({how}) "
                f"with its restart budget spent ({BUDGET_FLAGS['data_service']}"
                f"); see {self._log_path()}; rerun to resume from the "
                "latest checkpoint")
        self._spawn()
        self.wait_ready()
        self.log(f"psrec supervisor: tf.data service restarted on "
                 f"{self.address} (data pid {self.process.pid}) from its "
                 "journal; the training workers reconnect")
        return True

    def frozen(self) -> bool:
        """True when the service process is alive but stopped (SIGSTOP)."""
        return (self.process is not None and self.process.poll() is None
                and is_frozen(self.process.pid))

    def kill_if_frozen(self) -> bool:
        """After a stall: a frozen service cannot hand out data (the
        coordinator's closures wait on it), so it is killed, and the next
        :meth:`keep` restarts it from its journal; True when it was."""
        if not self.frozen():
            return False
        self.process.kill()
        self.process.wait()
        return True

    def stop(self) -> None:
        stop_processes([self.process])

    def _log_path(self) -> Path:
        return self.state_dir / "logs" / "data-dispatcher.log"

    def wait_ready(self) -> None:
        """Blocks until the dispatcher listens (see ``wait_listening``)."""
        wait_listening("data-dispatcher", self.process, self.address,
                       self._log_path(), time.monotonic() + START_TIMEOUT,
                       START_TIMEOUT)

    def _spawn(self) -> None:
        path = self._log_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.process = spawn(psrec_command(
            "psrec", "data-server", "--role", "dispatcher", "--port",
            str(self.port), "--local-workers", str(self.workers),
            "--work-dir", str(self.journal), "--run-dir", self.run_dir), path)
