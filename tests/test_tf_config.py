"""Tests of ps_cluster.tf_config and .addresses: TF_CONFIG parsing, writing
and validation."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from psrec.ps_cluster.cluster.addresses import ClusterSpecError
from psrec.ps_cluster.cluster.addresses import parse_address
from psrec.ps_cluster.cluster.addresses import parse_address_list
from psrec.ps_cluster.cluster.tf_config import REMOTE_WARNING
from psrec.ps_cluster.cluster.tf_config import ClusterSpec
from psrec.ps_cluster.cluster.tf_config import TaskInfo
from psrec.ps_cluster.cluster.tf_config import TFConfig
from psrec.ps_cluster.cluster.tf_config import tf_configs_for_all_tasks
from psrec.ps_cluster.cluster.tf_config import write_tf_config_files

CHIEF = "localhost:2222"
PS = ("localhost:2223", "localhost:2224")
WORKERS = ("localhost:2225", "localhost:2226")


@pytest.fixture
def spec() -> ClusterSpec:
    return ClusterSpec.build(ps=PS, workers=WORKERS, chief=CHIEF)


def _config_json(cluster: dict, task: dict | None = None, **extra) -> str:
    data = {"cluster": cluster, **extra}
    if task is not None:
        data["task"] = task
    return json.dumps(data)


# --------------------------------------------------------------------------
# parse_address
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("localhost:2222", ("localhost", 2222)),
        ("127.0.0.1:1", ("127.0.0.1", 1)),
        ("[::1]:65535", ("::1", 65535)),
        ("worker-0.example.internal:8470", ("worker-0.example.internal", 8470)),
        ("10.1.2.3:2222", ("10.1.2.3", 2222)),
    ],
)
def test_parse_address_valid(text, expected):
    assert parse_address(text) == expected


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("localhost", r"'localhost' has no port; add one, e\.g\. 'localhost:2222'"),
        ("localhost:", r"'localhost:' has an empty port; put a port number"),
        ("localhost:0", r"'localhost:0' has port 0, which is out of range; use a port in 1\.\.65535"),
        ("localhost:65536", r"port 65536, which is out of range; use a port in 1\.\.65535"),
        ("localhost:http", r"port 'http', which is not a number; use a port in 1\.\.65535"),
        (":2222", r"':2222' has an empty host; put a hostname or IP"),
        ("", r"empty string; write it as 'host:port'"),
        ("::1:2222", r"'::1:2222' looks like an unbracketed IPv6.*brackets, e\.g\. '\[::1\]:2222'"),
        ("[::1]", r"'\[::1\]' has no port after '\]'; add one, e\.g\. '\[::1\]:2222'"),
        ("[::1:2222", r"never closes it"),
        ("[]:2222", r"empty host between the brackets"),
        ("[localhost]:2222", r"has 'localhost' inside brackets, which is not an IPv6"),
        ("grpc://localhost:2222", r"URL scheme.*'localhost:2222'"),
        ("local host:2222", r"contains whitespace; remove it"),
        ("bad_host!:2222", r"host 'bad_host!'.*neither an IP address nor a valid hostname"),
    ],
)
def test_parse_address_errors(text, pattern):
    with pytest.raises(ClusterSpecError, match=pattern):
        parse_address(text)


def test_parse_address_rejects_non_string():
    with pytest.raises(ClusterSpecError, match=r"2222 is a int, not a string"):
        parse_address(2222)  # type: ignore[arg-type]


def test_cluster_spec_error_is_value_error():
    assert issubclass(ClusterSpecError, ValueError)


def test_parse_address_list():
    assert parse_address_list("localhost:1, localhost:2") == ("localhost:1", "localhost:2")
    assert parse_address_list("  ") == ()
    with pytest.raises(ClusterSpecError, match=r"empty item at position 1; separate addresses"):
        parse_address_list("localhost:1,,localhost:2")
    with pytest.raises(ClusterSpecError, match=r"'localhost' has no port"):
        parse_address_list("localhost:1,localhost")


# --------------------------------------------------------------------------
# ClusterSpec construction and accessors
# --------------------------------------------------------------------------


def test_build_and_properties(spec):
    assert dict(spec.jobs) == {"chief": (CHIEF,), "ps": PS, "worker": WORKERS}
    assert spec.ps == PS
    assert spec.workers == WORKERS
    assert spec.chief == CHIEF
    assert spec.num_ps == 2
    assert spec.num_workers == 2


def test_build_without_chief_and_from_strings():
    spec = ClusterSpec.build(ps="localhost:1", workers="localhost:2, localhost:3")
    assert spec.chief is None
    assert "chief" not in spec.jobs
    assert spec.workers == ("localhost:2", "localhost:3")


def test_build_omits_empty_roles():
    spec = ClusterSpec.build(ps=[], workers=["localhost:2"])
    assert "ps" not in spec.jobs


def test_jobs_is_read_only_and_spec_is_frozen_and_hashable(spec):
    with pytest.raises(TypeError):
        spec.jobs["ps"] = ("localhost:9",)  # type: ignore[index]
    with pytest.raises(AttributeError):
        spec.jobs = {}  # type: ignore[misc]
    again = ClusterSpec({"worker": WORKERS, "ps": PS, "chief": (CHIEF,)})
    assert again == spec
    assert hash(again) == hash(spec)
    assert len({spec, again}) == 1


def test_jobs_are_copied_not_aliased():
    source = {"ps": ["localhost:1"], "worker": ["localhost:2"]}
    spec = ClusterSpec(source)
    source["ps"].append("localhost:3")
    assert spec.ps == ("localhost:1",)


def test_constructor_rejects_bad_address():
    with pytest.raises(ClusterSpecError, match=r"`cluster.worker\[1\]`: address 'localhost' has no port"):
        ClusterSpec({"worker": ["localhost:1", "localhost"]})


def test_constructor_rejects_string_job():
    with pytest.raises(ClusterSpecError, match=r"`cluster.ps` must be a list of 'host:port' strings, got str"):
        ClusterSpec({"ps": "localhost:1"})


def test_coordinator_job_is_called_chief():
    with pytest.raises(ClusterSpecError, match=r"unknown job name 'coordinator'.*TensorFlow names the coordinator job 'chief'"):
        ClusterSpec({"coordinator": ["localhost:1"], "ps": ["localhost:2"], "worker": ["localhost:3"]})


def test_to_tf_cluster_dict_order_and_copy(spec):
    d = spec.to_tf_cluster_dict()
    assert list(d) == ["chief", "ps", "worker"]
    d["ps"].append("localhost:9")
    assert spec.ps == PS


def test_address_of(spec):
    assert spec.address_of(TaskInfo("worker", 1)) == WORKERS[1]
    with pytest.raises(ClusterSpecError, match=r"task index 2 is out of range for job 'worker'"):
        spec.address_of(TaskInfo("worker", 2))


# --------------------------------------------------------------------------
# ClusterSpec.validate
# --------------------------------------------------------------------------


def test_loopback_default_passes(spec):
    spec.validate()
    assert spec.is_loopback()


def test_loopback_variants_pass():
    spec = ClusterSpec.build(ps=["127.0.0.1:1"], workers=["[::1]:2", "127.0.0.2:3"], chief="LOCALHOST:4")
    spec.validate()
    assert spec.is_loopback()


def test_multi_worker_mirrored_passes():
    ClusterSpec.build(ps=[], workers=WORKERS, chief=CHIEF).validate(strategy="multi-worker-mirrored")
    ClusterSpec.build(ps=[], workers=WORKERS).validate(strategy="multi-worker-mirrored")


def test_unknown_strategy():
    with pytest.raises(ClusterSpecError, match=r"unknown strategy 'mirrored'; use one of 'ps', 'multi-worker-mirrored'"):
        ClusterSpec.build(ps=PS, workers=WORKERS).validate(strategy="mirrored")


def test_empty_cluster():
    with pytest.raises(ClusterSpecError, match=r"cluster has no jobs \(empty job list\); add at least"):
        ClusterSpec({}).validate()


def test_unknown_job_name():
    with pytest.raises(ClusterSpecError, match=r"unknown job name 'workers' in cluster; rename it to one of .*'worker'"):
        ClusterSpec({"ps": ["localhost:1"], "workers": ["localhost:2"]})


def test_evaluator_in_training_cluster():
    with pytest.raises(
        ClusterSpecError,
        match=r"'evaluator'.*keep the evaluator out of the training cluster.*run it as a separate job.*tensorflow#46169",
    ):
        ClusterSpec({"ps": ["localhost:1"], "worker": ["localhost:2"], "evaluator": ["localhost:3"]})


def test_empty_job_address_list():
    spec = ClusterSpec({"ps": ["localhost:1"], "worker": []})
    with pytest.raises(ClusterSpecError, match=r"job 'worker' has an empty address list; add at least one 'host:port'"):
        spec.validate()


def test_ps_strategy_requires_ps():
    spec = ClusterSpec.build(ps=[], workers=WORKERS, chief=CHIEF)
    with pytest.raises(ClusterSpecError, match=r"There must be at least one ps task.*no 'ps'; add one, e\.g\. --ps-hosts"):
        spec.validate()


def test_ps_strategy_requires_worker():
    spec = ClusterSpec.build(ps=PS, workers=[], chief=CHIEF)
    with pytest.raises(ClusterSpecError, match=r"at least one worker task.*no 'worker'; add one, e\.g\. --worker-hosts"):
        spec.validate()


def test_mwm_rejects_ps():
    spec = ClusterSpec.build(ps=PS, workers=WORKERS)
    with pytest.raises(ClusterSpecError, match=r"job 'ps' \['localhost:2223', 'localhost:2224'\] is not allowed with strategy 'multi-worker-mirrored'.*remove the ps tasks"):
        spec.validate(strategy="multi-worker-mirrored")


def test_at_most_one_chief():
    spec = ClusterSpec({"chief": ["localhost:1", "localhost:2"], "ps": ["localhost:3"], "worker": ["localhost:4"]})
    with pytest.raises(ClusterSpecError, match=r"job 'chief' has 2 addresses .*at most one chief; keep one address and move the others to 'worker'"):
        spec.validate()


def test_duplicate_address_names_both_tasks():
    spec = ClusterSpec.build(ps=["localhost:2222"], workers=["localhost:2223", "localhost:2222"])
    with pytest.raises(ClusterSpecError, match=r"address 'localhost:2222' is used by both task ps\[0\] and task worker\[1\]; give every task its own port"):
        spec.validate()


def test_duplicate_loopback_port_with_different_spelling():
    spec = ClusterSpec.build(ps=["localhost:2222"], workers=["127.0.0.1:2222"])
    with pytest.raises(ClusterSpecError, match=r"'localhost:2222' and '127\.0\.0\.1:2222' are the same host:port.*ps\[0\].*worker\[0\]"):
        spec.validate()


def test_duplicate_remote_address_case_insensitive():
    spec = ClusterSpec.build(ps=["Host-A:2222"], workers=["host-a:2222"])
    with pytest.raises(ClusterSpecError, match=r"duplicate host:port.*ps\[0\].*worker\[0\]"):
        spec.validate(allow_remote=True)


def test_same_port_on_different_remote_hosts_is_fine():
    ClusterSpec.build(ps=["10.0.0.1:2222"], workers=["10.0.0.2:2222"]).validate(allow_remote=True)


@pytest.mark.parametrize("loopback", ["localhost:2222", "127.0.0.1:2222", "[::1]:2222"])
def test_loopback_mixed_with_remote(loopback):
    spec = ClusterSpec.build(ps=[loopback], workers=["10.0.0.2:2223"])
    with pytest.raises(
        ClusterSpecError,
        match=r"mixes loopback addresses \(ps\[0\]=.*\) with non-loopback hosts \(worker\[0\]=10\.0\.0\.2:2223\); loopback addresses .*only reach the local machine.*could not connect",
    ):
        spec.validate(allow_remote=True)


def test_loopback_mixed_with_remote_reported_before_allow_remote():
    spec = ClusterSpec.build(ps=["localhost:1"], workers=["10.0.0.2:2"])
    with pytest.raises(ClusterSpecError, match=r"mixes loopback addresses"):
        spec.validate()


@pytest.mark.parametrize(
    ("address", "host"),
    [
        ("10.0.0.2:2222", "10.0.0.2"),
        ("worker-0.example.internal:2222", "worker-0.example.internal"),
        ("0.0.0.0:2222", "0.0.0.0"),
        ("[::]:2222", "::"),
        ("[2001:db8::1]:2222", "2001:db8::1"),
    ],
)
def test_non_loopback_refused_without_allow_remote(address, host):
    spec = ClusterSpec.build(ps=["10.9.9.9:2221"], workers=[address])
    with pytest.raises(ClusterSpecError, match=r"non-loopback host '10\.9\.9\.9'.*needs `StrategyConfig\.allow_remote`"):
        spec.validate()
    spec = ClusterSpec.build(ps=[address], workers=["10.9.9.9:2221"])
    with pytest.raises(
        ClusterSpecError,
        match=rf"non-loopback host '{re.escape(host)}' \(task ps\[0\] = '{re.escape(address)}'\) needs `StrategyConfig\.allow_remote`.*unauthenticated, unencrypted connections on all interfaces.*isolated network",
    ):
        spec.validate()
    assert not spec.is_loopback()


def test_wildcard_bind_address_hint():
    spec = ClusterSpec.build(ps=["0.0.0.0:1"], workers=["0.0.0.0:2"])
    with pytest.raises(ClusterSpecError, match=r"0\.0\.0\.0 is a wildcard bind address"):
        spec.validate()


def test_non_loopback_accepted_with_allow_remote():
    spec = ClusterSpec.build(ps=["10.0.0.1:2222"], workers=["10.0.0.2:2222", "10.0.0.2:2223"], chief="10.0.0.3:2222")
    spec.validate(allow_remote=True)
    assert not spec.is_loopback()


def test_remote_warning_text():
    for phrase in ("unauthenticated", "unencrypted", "all network interfaces", "isolated", "SECURITY.md"):
        assert phrase in REMOTE_WARNING


# --------------------------------------------------------------------------
# TaskInfo
# --------------------------------------------------------------------------


def test_task_info_negative_index():
    with pytest.raises(ClusterSpecError, match=r"task index -1 for job 'worker' is negative; indices start at 0, fix the `task.index`"):
        TaskInfo("worker", -1)


@pytest.mark.parametrize("index", ["0", 1.0, True])
def test_task_info_non_int_index(index):
    with pytest.raises(ClusterSpecError, match=r"must be an integer; set `task.index`"):
        TaskInfo("worker", index)  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# TFConfig parsing
# --------------------------------------------------------------------------


def test_from_json_basic(spec):
    config = TFConfig.from_json(_config_json(spec.to_tf_cluster_dict(), {"type": "worker", "index": 1}))
    assert config.cluster == spec
    assert config.task == TaskInfo("worker", 1)
    assert not config.is_coordinator
    config.validate()


def test_from_json_without_task_is_coordinator(spec):
    config = TFConfig.from_json(_config_json(spec.to_tf_cluster_dict()))
    assert config.task is None
    assert config.is_coordinator
    assert TFConfig.from_json(_config_json(spec.to_tf_cluster_dict(), {})).task is None


def test_from_json_chief_is_coordinator(spec):
    config = TFConfig.from_json(_config_json(spec.to_tf_cluster_dict(), {"type": "chief", "index": 0}))
    assert config.is_coordinator


def test_from_json_accepts_environment_and_rpc_layer(spec):
    text = _config_json(spec.to_tf_cluster_dict(), {"type": "ps", "index": 0}, environment="cloud", rpc_layer="grpc")
    config = TFConfig.from_json(text)
    assert config == TFConfig(spec, TaskInfo("ps", 0))
    assert "environment" not in config.to_json()


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ('{"cluster": {"ps": ["localhost:1"],}}', r"TF_CONFIG is not valid JSON \(.* at line 1 column \d+\): .*fix the JSON"),
        ("[1, 2]", r"TF_CONFIG must be a JSON object, got list \[1, 2\]"),
        ("", r"TF_CONFIG is empty \(''\); set it to a JSON object"),
        ('{"task": {"type": "worker", "index": 0}}', r"TF_CONFIG has no `cluster` key; add one"),
        ('{"cluster": ["localhost:1"]}', r"`cluster` must be an object mapping job names.*got list \['localhost:1'\]"),
        ('{"cluster": {"ps": "localhost:1"}}', r"`cluster.ps` must be a list of 'host:port' strings, got str 'localhost:1'"),
        ('{"cluster": {"ps": {"0": "localhost:1"}}}', r"`cluster.ps` must be a list.*got dict"),
        ('{"cluster": {"worker": ["localhost:1", 2222]}}', r"`cluster.worker\[1\]`: address 2222 is a int, not a string; write it as a 'host:port' string"),
        ('{"cluster": {"worker": ["localhost"]}}', r"`cluster.worker\[0\]`: address 'localhost' has no port"),
        ('{"cluster": {"coordinator": ["localhost:1"]}}', r"unknown job name 'coordinator'"),
        ('{"cluster": {"worker": ["localhost:1"]}, "clustr": {}}', r"unknown top-level key\(s\) 'clustr'; allowed keys are 'cluster', 'task', 'environment', 'rpc_layer'"),
        ('{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "ps", "index": 0}}', r"task type 'ps' is not a job in the cluster \(jobs: 'worker'\); fix the `task.type`"),
        ('{"cluster": {"worker": ["localhost:1", "localhost:2"]}, "task": {"type": "worker", "index": 3}}', r"task index 3 is out of range for job 'worker' which has 2 tasks \(indices 0\.\.1\); fix the `task.index` in TF_CONFIG"),
        ('{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": -1}}', r"task index -1 for job 'worker' is negative.*fix the `task.index`"),
        ('{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": "0"}}', r"task index '0' \(str\) must be an integer"),
        ('{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker"}}', r"`task` .* has no 'index'; add it"),
        ('{"cluster": {"worker": ["localhost:1"]}, "task": {"index": 0}}', r"`task` .* has no 'type'; add it"),
        ('{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": 0, "id": 1}}', r"`task` has unknown key\(s\) 'id'"),
        ('{"cluster": {"worker": ["localhost:1"]}, "task": "worker"}', r"`task` must be an object, got str 'worker'"),
    ],
)
def test_from_json_errors(text, pattern):
    with pytest.raises(ClusterSpecError, match=pattern):
        TFConfig.from_json(text)


def test_tfconfig_validate_runs_cluster_checks():
    text = _config_json({"ps": ["10.0.0.1:1"], "worker": ["10.0.0.2:1"]}, {"type": "worker", "index": 0})
    config = TFConfig.from_json(text)
    with pytest.raises(ClusterSpecError, match=r"needs `StrategyConfig\.allow_remote`"):
        config.validate()
    config.validate(allow_remote=True)
    with pytest.raises(ClusterSpecError, match=r"not allowed with strategy 'multi-worker-mirrored'"):
        config.validate(strategy="multi-worker-mirrored", allow_remote=True)


# --------------------------------------------------------------------------
# TFConfig writing
# --------------------------------------------------------------------------


def test_to_json_is_compact_sorted_and_round_trips(spec):
    config = TFConfig(spec, TaskInfo("worker", 1))
    text = config.to_json()
    assert " " not in text
    assert text == (
        '{"cluster":{"chief":["localhost:2222"],"ps":["localhost:2223","localhost:2224"],'
        '"worker":["localhost:2225","localhost:2226"]},"task":{"index":1,"type":"worker"}}'
    )
    assert TFConfig.from_json(text) == config
    assert json.loads(text) == config.to_dict()
    # Deterministic regardless of job insertion order.
    shuffled = ClusterSpec({"worker": WORKERS, "ps": PS, "chief": (CHIEF,)})
    assert TFConfig(shuffled, TaskInfo("worker", 1)).to_json() == text


def test_to_json_without_task_round_trips(spec):
    config = TFConfig(spec, None)
    assert "task" not in config.to_dict()
    assert TFConfig.from_json(config.to_json()) == config


def test_from_env(spec):
    config = TFConfig(spec, TaskInfo("ps", 1))
    assert TFConfig.from_env({"TF_CONFIG": config.to_json()}) == config
    assert TFConfig.from_env({}) is None
    assert TFConfig.from_env({"TF_CONFIG": ""}) is None
    assert TFConfig.from_env({"TF_CONFIG": "  "}) is None
    with pytest.raises(ClusterSpecError, match=r"not valid JSON"):
        TFConfig.from_env({"TF_CONFIG": "{nope"})


def test_from_env_defaults_to_os_environ(spec, monkeypatch):
    config = TFConfig(spec, TaskInfo("chief", 0))
    monkeypatch.setenv("TF_CONFIG", config.to_json())
    assert TFConfig.from_env() == config
    monkeypatch.delenv("TF_CONFIG")
    assert TFConfig.from_env() is None


# --------------------------------------------------------------------------
# Per-task configs
# --------------------------------------------------------------------------


def test_tf_configs_for_all_tasks(spec):
    configs = tf_configs_for_all_tasks(spec)
    assert [c.task for c in configs] == [
        TaskInfo("chief", 0),
        TaskInfo("ps", 0),
        TaskInfo("ps", 1),
        TaskInfo("worker", 0),
        TaskInfo("worker", 1),
    ]
    assert all(c.cluster == spec for c in configs)
    for config in configs:
        parsed = json.loads(config.to_json())
        assert parsed["cluster"] == spec.to_tf_cluster_dict()
        assert parsed["task"] == {"type": config.task.type, "index": config.task.index}
        config.validate()
    assert [c.is_coordinator for c in configs] == [True, False, False, False, False]


def test_tf_configs_for_all_tasks_without_chief():
    spec = ClusterSpec({"worker": ["localhost:3"], "ps": ["localhost:1"]})
    assert [str(c.task) for c in tf_configs_for_all_tasks(spec)] == ["ps[0]", "worker[0]"]


def test_write_tf_config_files(spec, tmp_path: Path):
    out_dir = tmp_path / "nested" / "tf_configs"
    paths = write_tf_config_files(spec, out_dir)
    assert [p.name for p in paths] == ["chief-0.json", "ps-0.json", "ps-1.json", "worker-0.json", "worker-1.json"]
    assert sorted(out_dir.iterdir()) == sorted(paths)
    for path, config in zip(paths, tf_configs_for_all_tasks(spec)):
        text = path.read_text(encoding="utf-8")
        assert text == config.to_json() + "\n"
        assert TFConfig.from_json(text) == config
    # Re-writing overwrites in place.
    assert write_tf_config_files(spec, out_dir) == paths


def test_module_does_not_import_tensorflow():
    code = "import sys, psrec.ps_cluster.cluster.tf_config; print('tensorflow' in sys.modules)"
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
