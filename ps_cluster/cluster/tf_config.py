"""``TF_CONFIG``: the cluster spec of a multi-process TensorFlow job.

Parses, validates and writes the JSON that ``ParameterServerStrategy`` and
``MultiWorkerMirroredStrategy`` read::

    {"cluster": {"chief": ["localhost:2222"], "ps": ["localhost:2223"],
                 "worker": ["localhost:2224", "localhost:2225"]},
     "task": {"type": "worker", "index": 1}}

Every mistake is a :class:`ClusterSpecError` naming the value and the fix,
raised before any gRPC server starts. A TF gRPC server is unauthenticated,
unencrypted and listens on all interfaces, so :meth:`ClusterSpec.validate`
refuses non-loopback hosts unless ``allow_remote=True`` (``--allow-remote``;
print :data:`REMOTE_WARNING` then). Pure Python: never imports TensorFlow.
"""

from __future__ import annotations

import json
import os
import types
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psrec.ps_cluster.cluster.addresses import ClusterSpecError
from psrec.ps_cluster.cluster.addresses import check_addresses
from psrec.ps_cluster.cluster.addresses import free_loopback_ports
from psrec.ps_cluster.cluster.addresses import is_loopback_host
from psrec.ps_cluster.cluster.addresses import parse_address
from psrec.ps_cluster.cluster.addresses import parse_address_list

TF_CONFIG_ENV = "TF_CONFIG"
#: The jobs of a training cluster, in launch order; ``chief`` coordinates.
JOBS: tuple[str, ...] = ("chief", "ps", "worker")
STRATEGIES: tuple[str, ...] = ("ps", "multi-worker-mirrored")

REMOTE_WARNING = (
    "WARNING: --allow-remote is set and the cluster spec contains non-loopback "
    "hosts. TensorFlow gRPC servers accept unauthenticated, unencrypted "
    "connections and listen on all network interfaces: anyone who can reach "
    "these ports can read and overwrite model variables and run arbitrary "
    "TensorFlow ops (including file and process access) on every task. Run "
    "this cluster only on an isolated, trusted network, firewalled from "
    "everything else. See TensorFlow's SECURITY.md "
    "(https://github.com/tensorflow/tensorflow/blob/master/SECURITY.md)."
)

_JOB_HINTS = {
    "coordinator": "; TensorFlow names the coordinator job 'chief'",
    "evaluator": "; keep the evaluator out of the training cluster and run "
    "it as a separate job (a sidecar evaluator with its own TF_CONFIG) — see "
    "tensorflow#46169",
}
_TOP_LEVEL_KEYS = ("cluster", "task", "environment", "rpc_layer")
_EXAMPLE_CONFIG = ('{"cluster": {"ps": ["localhost:2223"], "worker": '
                   '["localhost:2224"]}, "task": {"type": "worker", "index": 0}}')


@dataclass(frozen=True)
class TaskInfo:
    """The task a process plays (``TF_CONFIG["task"]``), e.g. worker 1."""

    type: str
    index: int

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or not self.type:
            raise ClusterSpecError(
                f"task type {self.type!r} must be a non-empty string; set "
                "`task.type` in TF_CONFIG to a job name such as 'worker'")
        if isinstance(self.index, bool) or not isinstance(self.index, int):
            raise ClusterSpecError(
                f"task index {self.index!r} ({type(self.index).__name__}) must "
                "be an integer; set `task.index` in TF_CONFIG to e.g. 0")
        if self.index < 0:
            raise ClusterSpecError(
                f"task index {self.index} for job {self.type!r} is negative; "
                "indices start at 0, fix the `task.index` in TF_CONFIG")

    def __str__(self) -> str:
        return f"{self.type}[{self.index}]"

    @property
    def name(self) -> str:
        """``ps-0``, ``worker-1``: how logs and messages name the task."""
        return f"{self.type}-{self.index}"


@dataclass(frozen=True, repr=False)
class ClusterSpec:
    """Job name -> ``host:port`` of each task (read-only, in :data:`JOBS`
    order). Construction checks the structure; :meth:`validate` the policy."""

    jobs: Mapping[str, tuple[str, ...]]

    def __post_init__(self) -> None:
        if not isinstance(self.jobs, Mapping):
            raise ClusterSpecError(
                "`cluster` must be an object mapping job names to "
                f"address lists, got {type(self.jobs).__name__} {self.jobs!r}; "
                'write e.g. "cluster": {"ps": ["localhost:2223"], '
                '"worker": ["localhost:2224"]}')
        for name, addresses in self.jobs.items():
            if name not in JOBS:
                raise ClusterSpecError(
                    f"unknown job name {name!r} in cluster; rename it to one "
                    f"of {', '.join(map(repr, JOBS))}{_JOB_HINTS.get(name, '')}")
            if not isinstance(addresses, (list, tuple)):
                raise ClusterSpecError(
                    f"`cluster.{name}` must be a list of 'host:port' "
                    f"strings, got {type(addresses).__name__} {addresses!r}; "
                    f'write e.g. "{name}": ["localhost:2222"]')
            for index, address in enumerate(addresses):
                try:
                    parse_address(address)
                except ClusterSpecError as exc:
                    raise ClusterSpecError(
                        f"`cluster.{name}[{index}]`: {exc}") from None
        object.__setattr__(self, "jobs", types.MappingProxyType(
            {job: tuple(self.jobs[job]) for job in JOBS if job in self.jobs}))

    @classmethod
    def build(cls, ps: Sequence[str] | str, workers: Sequence[str] | str,
              chief: str | None = None) -> ClusterSpec:
        """A spec from per-role addresses (lists, or comma-separated strings
        as the CLI gets them); roles without addresses are left out."""
        jobs = {"chief": (chief.strip(),)} if chief and chief.strip() else {}
        for name, value in (("ps", ps), ("worker", workers)):
            addresses = (parse_address_list(value) if isinstance(value, str)
                         else tuple(a.strip() if isinstance(a, str) else a
                                    for a in value))
            if addresses:
                jobs[name] = addresses
        return cls(jobs)

    @classmethod
    def from_dict(cls, cluster: Any) -> ClusterSpec:
        """The spec of a ``TF_CONFIG["cluster"]`` value."""
        return cls(cluster)

    def __hash__(self) -> int:
        return hash(tuple(self.jobs.items()))

    def __repr__(self) -> str:
        return f"ClusterSpec(jobs={dict(self.jobs)!r})"

    @property
    def ps(self) -> tuple[str, ...]:
        return self.jobs.get("ps", ())

    @property
    def workers(self) -> tuple[str, ...]:
        return self.jobs.get("worker", ())

    @property
    def chief(self) -> str | None:
        return next(iter(self.jobs.get("chief", ())), None)

    @property
    def num_ps(self) -> int:
        return len(self.ps)

    @property
    def num_workers(self) -> int:
        """Worker tasks, not counting the chief."""
        return len(self.workers)

    def tasks(self) -> tuple[TaskInfo, ...]:
        """Every task, in launch order: chief, ps, worker."""
        return tuple(TaskInfo(name, index) for name, addresses
                     in self.jobs.items() for index in range(len(addresses)))

    def address_of(self, task: TaskInfo) -> str:
        _check_task_in_cluster(task, self)
        return self.jobs[task.type][task.index]

    def is_loopback(self) -> bool:
        """True if every host is a loopback host (``0.0.0.0`` is not)."""
        return all(is_loopback_host(parse_address(a)[0])
                   for addresses in self.jobs.values() for a in addresses)

    def to_tf_cluster_dict(self) -> dict[str, list[str]]:
        """A new ``{job: [address, ...]}`` for ``tf.train.ClusterSpec``."""
        return {name: list(addresses) for name, addresses in self.jobs.items()}

    def validate(self, *, strategy: str = "ps",
                 allow_remote: bool = False) -> None:
        """Checks the cluster is usable and safe for ``strategy`` (``ps`` or
        ``multi-worker-mirrored``); ``allow_remote`` accepts non-loopback
        hosts (isolated networks only)."""
        if strategy not in STRATEGIES:
            raise ClusterSpecError(f"unknown strategy {strategy!r}; use one of "
                                   f"{', '.join(map(repr, STRATEGIES))}")
        if not self.jobs:
            raise ClusterSpecError(
                "cluster has no jobs (empty job list); add at least the 'ps' "
                "and 'worker' jobs, e.g. --ps-hosts localhost:2223 "
                "--worker-hosts localhost:2224")
        for name, addresses in self.jobs.items():
            if not addresses:
                raise ClusterSpecError(
                    f"job {name!r} has an empty address list; add at least one "
                    f"'host:port' to it or remove the {name!r} job")
        jobs = sorted(self.jobs)
        if strategy == "ps" and not self.ps:
            raise ClusterSpecError(
                "There must be at least one ps task for ParameterServerStrategy"
                f", but the cluster has jobs {jobs} and no 'ps'; add one, e.g. "
                "--ps-hosts localhost:2223 (cluster 'ps': [...])")
        if strategy == "ps" and not self.workers:
            raise ClusterSpecError(
                "There must be at least one worker task for ParameterServer"
                f"Strategy, but the cluster has jobs {jobs} and no 'worker'; "
                "add one, e.g. --worker-hosts localhost:2224 (cluster "
                "'worker': [...])")
        if strategy != "ps" and self.ps:
            raise ClusterSpecError(
                f"job 'ps' {list(self.ps)} is not allowed with strategy "
                f"{strategy!r}, which keeps variables on the workers; remove "
                "the ps tasks or use strategy 'ps'")
        if len(self.jobs.get("chief", ())) > 1:
            raise ClusterSpecError(
                f"job 'chief' has {len(self.jobs['chief'])} addresses "
                f"{list(self.jobs['chief'])} but there can be at most one "
                "chief; keep one address and move the others to 'worker'")
        check_addresses([(str(task), self.address_of(task))
                         for task in self.tasks()], allow_remote)


def _check_task_in_cluster(task: TaskInfo, cluster: ClusterSpec) -> None:
    if task.type not in cluster.jobs:
        raise ClusterSpecError(
            f"task type {task.type!r} is not a job in the cluster (jobs: "
            f"{', '.join(map(repr, cluster.jobs)) or 'none'}); fix the "
            "`task.type` in TF_CONFIG or add the job to `cluster`")
    size = len(cluster.jobs[task.type])
    if task.index >= size:
        indices = f"indices 0..{size - 1}" if size else "no valid indices"
        raise ClusterSpecError(
            f"task index {task.index} is out of range for job {task.type!r} "
            f"which has {size} task{'' if size == 1 else 's'} ({indices}); "
            "fix the `task.index` in TF_CONFIG")


# -- TF_CONFIG -----------------------------------------------------------------


@dataclass(frozen=True)
class TFConfig:
    """A parsed ``TF_CONFIG``: the cluster, and this process's task (None for
    a coordinator that is not listed, or a cluster-only config)."""

    cluster: ClusterSpec
    task: TaskInfo | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.cluster, ClusterSpec):
            raise ClusterSpecError(
                "TFConfig.cluster must be a ClusterSpec, got "
                f"{type(self.cluster).__name__}")
        if self.task is not None:
            _check_task_in_cluster(self.task, self.cluster)

    @classmethod
    def from_json(cls, text: str) -> TFConfig:
        """Parses ``TF_CONFIG``; ``environment`` and ``rpc_layer`` are
        accepted and ignored."""
        return cls.from_dict(_decode(text, "TF_CONFIG"))

    @classmethod
    def from_file(cls, path: str | Path) -> TFConfig:
        """A ``TF_CONFIG`` file (``psrec tf-config --out``), or a file that
        holds only its ``cluster`` object (then the task is None)."""
        if not Path(path).is_file():
            raise ClusterSpecError(
                f"cluster file {path} does not exist; write one with "
                "`psrec tf-config --out DIR`.")
        data = _decode(Path(path).read_text(), f"cluster file {path}")
        if isinstance(data, Mapping) and "cluster" not in data:
            data = {"cluster": data}
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> TFConfig:
        """The config of an already-decoded ``TF_CONFIG`` object."""
        if not isinstance(data, Mapping):
            raise ClusterSpecError(
                f"TF_CONFIG must be a JSON object, got {type(data).__name__} "
                f"{data!r}; write it as {_EXAMPLE_CONFIG}")
        _reject_unknown("TF_CONFIG has unknown top-level", data, _TOP_LEVEL_KEYS)
        if "cluster" not in data:
            raise ClusterSpecError(
                "TF_CONFIG has no `cluster` key; add one, e.g. "
                '"cluster": {"ps": ["localhost:2223"], "worker": '
                '["localhost:2224"]}')
        task = data.get("task")
        if task is not None and not isinstance(task, Mapping):
            raise ClusterSpecError(
                f"TF_CONFIG `task` must be an object, got {type(task).__name__}"
                f" {task!r}; write e.g. \"task\": {{\"type\": \"worker\", "
                "\"index\": 0}")
        if task:
            _reject_unknown("TF_CONFIG `task` has unknown", task,
                            ("type", "index", "trial"))
            for key in ("type", "index"):
                if key not in task:
                    raise ClusterSpecError(
                        f"TF_CONFIG `task` {dict(task)!r} has no {key!r}; add "
                        'it, e.g. "task": {"type": "worker", "index": 0}')
        return cls(ClusterSpec(data["cluster"]),
                   TaskInfo(task["type"], task["index"]) if task else None)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None
                 ) -> TFConfig | None:
        """``TF_CONFIG`` of ``environ`` (default ``os.environ``); None if it
        is unset or blank."""
        text = (os.environ if environ is None else environ).get(TF_CONFIG_ENV)
        if text is None or not text.strip():
            return None
        return cls.from_json(text)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cluster": self.cluster.to_tf_cluster_dict()}
        if self.task is not None:
            out["task"] = {"type": self.task.type, "index": self.task.index}
        return out

    def to_json(self) -> str:
        """Compact JSON with sorted keys; ``from_json`` round-trips it."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def is_coordinator(self) -> bool:
        """True with no task (a coordinator outside the cluster) or chief."""
        return self.task is None or self.task.type == "chief"

    def validate(self, *, strategy: str = "ps",
                 allow_remote: bool = False) -> None:
        """:meth:`ClusterSpec.validate` of the cluster (the task was checked
        on construction)."""
        self.cluster.validate(strategy=strategy, allow_remote=allow_remote)


def _decode(text: str, source: str) -> Any:
    if not isinstance(text, str) or not text.strip():
        raise ClusterSpecError(f"{source} is empty ({text!r}); set it to a "
                               f"JSON object such as {_EXAMPLE_CONFIG}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        snippet = text if len(text) <= 80 else text[:77] + "..."
        raise ClusterSpecError(
            f"{source} is not valid JSON ({exc.msg} at line {exc.lineno} "
            f"column {exc.colno}): {snippet!r}; fix the JSON, e.g. use "
            "double quotes and no trailing commas") from None


def _reject_unknown(what: str, data: Mapping, allowed: tuple[str, ...]) -> None:
    unknown = [key for key in data if key not in allowed]
    if unknown:
        raise ClusterSpecError(
            f"{what} key(s) {', '.join(map(repr, unknown))}; allowed keys are "
            f"{', '.join(map(repr, allowed))} — remove or rename them (check "
            "the spelling)")


# -- per-task configs and local clusters ----------------------------------------


def tf_configs_for_all_tasks(spec: ClusterSpec) -> list[TFConfig]:
    """One ``TF_CONFIG`` per task, in launch order (validate ``spec`` first)."""
    return [TFConfig(spec, task) for task in spec.tasks()]


def write_tf_config_files(spec: ClusterSpec,
                          out_dir: str | os.PathLike[str]) -> list[Path]:
    """Writes ``<type>-<index>.json`` (``to_json()`` + newline) per task into
    ``out_dir`` (created; existing files replaced); returns the paths."""
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for config in tf_configs_for_all_tasks(spec):
        path = directory / f"{config.task.type}-{config.task.index}.json"
        path.write_text(config.to_json() + "\n", encoding="utf-8")
        paths.append(path)
    return paths


def loopback_cluster(num_workers: int, num_ps: int) -> ClusterSpec:
    """A cluster spec of free ports on 127.0.0.1 (the local default)."""
    ports = free_loopback_ports(num_workers + num_ps)
    return ClusterSpec.build(
        ps=[f"127.0.0.1:{p}" for p in ports[num_workers:]],
        workers=[f"127.0.0.1:{p}" for p in ports[:num_workers]])
