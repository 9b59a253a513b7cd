"""``psrec train --strategy multi-worker-mirrored`` without ``TF_CONFIG``:
local workers on loopback.

The launcher checks the data once (and records it), then starts
``--workers`` job processes (:func:`psrec.launch.job.run.job_process_command`,
role ``worker``) that each run the job it hands them in a ``job.json``, with
their own ``TF_CONFIG`` -- the one child protocol psrec has (the PS
supervisor starts its coordinator the same way). It waits for them with a
timeout, stops every one by pid whatever happens, and returns the chief's
summary.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from psrec.errors import DataError
from psrec.launch.job.config import JobConfig
from psrec.launch.job.run import job_process_command
from psrec.launch.local.cluster import spawn
from psrec.launch.local.cluster import stop_processes
from psrec.launch.local.cluster import tail_log
from psrec.launch.local.netns import announce
from psrec.launch.local.netns import exposed_warning
from psrec.launch.local.netns import exposure
from psrec.ps_cluster.cluster.tf_config import ClusterSpec
from psrec.ps_cluster.cluster.tf_config import TaskInfo
from psrec.ps_cluster.cluster.tf_config import TFConfig
from psrec.ps_cluster.cluster.tf_config import free_loopback_ports
from psrec.runtime import role_environment
from psrec.uri_path import as_path


class WorkerFailedError(DataError):
    """A local multi-worker-mirrored worker exited with an error or hung."""


def run_local_workers(config: JobConfig, log=print, timeout: float = 1800.0,
                      allow_exposed: bool = False,
                      json_output: bool = False) -> dict:
    """Runs ``config.workers`` workers of the job (``json_output``: they log
    as ``psrec train --json`` does) and returns the chief's
    ``summary.json`` data.

    Outside a private network namespace the workers are refused (an
    ``ExposedError``) unless ``allow_exposed``; a warning then names every
    worker's port.

    Raises:
      WorkerFailedError: a worker exited non-zero or did not finish within
        ``timeout`` seconds (its log tail is in the message).
    """
    workdir = as_path(config.workdir)
    logs = config.state_dir / "logs"  # local even for a remote workdir
    logs.mkdir(parents=True, exist_ok=True)
    (workdir / "summary.json").unlink(missing_ok=True)
    cluster = ClusterSpec({"worker": [
        f"127.0.0.1:{p}" for p in free_loopback_ports(config.workers)]})
    cluster.validate(strategy="multi-worker-mirrored")
    exposed = exposure(allow_exposed, "the local workers")
    announce(exposed, lambda: exposed_warning(
        {f"worker-{i}": int(a.rsplit(":", 1)[1])
         for i, a in enumerate(cluster.workers)}, exposed or ""), log)
    processes: dict[int, subprocess.Popen] = {}
    command = job_process_command(
        config, "worker", config.state_dir / "workers",
        *(["--json"] if json_output else []))
    try:
        for index in range(config.workers):
            env = role_environment()
            env["TF_CONFIG"] = TFConfig(cluster,
                                        TaskInfo("worker", index)).to_json()
            env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
            processes[index] = spawn(command, logs / f"worker-{index}.log",
                                     env)
        log(f"local multi-worker-mirrored: {config.workers} workers on "
            f"{', '.join(cluster.workers)} (pids "
            f"{', '.join(str(p.pid) for p in processes.values())}); logs in "
            f"{logs}")
        _wait(processes, logs, timeout)
    finally:
        stop_processes(processes.values())
    return json.loads((workdir / "summary.json").read_text())


def _wait(processes: dict[int, subprocess.Popen], logs: Path,
          timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = dict(processes)
    while pending:
        for index, process in list(pending.items()):
            try:
                code = process.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
            del pending[index]
            if code != 0:
                raise WorkerFailedError(
                    f"multi-worker-mirrored worker {index} exited with code "
                    f"{code}; log tail:\n"
                    f"{tail_log(logs / f'worker-{index}.log')}")
        if pending and time.monotonic() > deadline:
            index = min(pending)
            raise WorkerFailedError(
                f"multi-worker-mirrored worker(s) {sorted(pending)} did not "
                f"finish within {timeout:.0f} s; log tail of worker "
                f"{index}:\n{tail_log(logs / f'worker-{index}.log')}")

