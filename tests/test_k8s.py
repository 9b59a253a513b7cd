"""``psrec k8s render``: the objects validate against the real schemas (the
TFJob CRD of Kubeflow's training operator, release 1.9, with jsonschema;
the core objects with kubernetes-validate, strict) and mean what psrec
needs (container names, restart and exit-code policies, isolation,
probes, TF_CONFIG); ``psrec k8s simulate`` runs both backends' pods as
real processes that train a tiny job and exit 0."""

import json
import math
import re

import jsonschema
import kubernetes_validate
import pytest
import yaml

from psrec import errors
from psrec.errors import RETRYABLE_EXIT_CODES
from psrec.launch.cli.main import main
from psrec.launch.k8s.pods import manifest_pods
from psrec.launch.k8s.pods import operator_tf_config
from tests._proc import pid_alive
from tests._proc import run_psrec
from tests._shared import SHARED_DATA

TFJOB_CRD = SHARED_DATA.parent / "k8s" / "kubeflow.org_tfjobs.yaml"
#: The oldest Kubernetes the plain backend needs (GA podFailurePolicy,
#: the pod-index label) and the newest schema kubernetes-validate has.
K8S_VERSIONS = ("1.32.0", kubernetes_validate.latest_version())
COMMON = ["--name", "ctr", "--image", "registry.example/psrec:1.0",
          "--namespace", "ml", "--workers", "3", "--ps", "2",
          "--data", "gs://bucket/criteo/tfrecord",
          "--workdir", "gs://bucket/runs/ctr", "--ps-memory", "6Gi"]
TINY = ["--synthetic-rows", "2000", "--steps", "10", "--batch-size", "64",
        "--steps-per-closure", "5", "--eval-every", "0", "--keep-best",
        "none", "--no-export"]


def _render(tmp_path, *args, name="job.yaml"):
    out = tmp_path / name
    assert main(["k8s", "render", "--out", str(out), *map(str, args)]) == 0
    return [o for o in yaml.safe_load_all(out.read_text()) if o]


def _strict(schema):
    """The CRD schema refusing unknown fields (the API server would prune
    them silently: a misspelt field must fail here)."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def tfjob_schema():
    crd = yaml.safe_load(TFJOB_CRD.read_text())
    return _strict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def _validate_core(item):
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(item, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{item['kind']} {item['metadata']['name']} "
                        f"invalid for Kubernetes {version}: {error.message} "
                        f"at {list(error.path)}")


def _container(template):
    [container] = template["spec"]["containers"]
    return container


def _env(container):
    return {e["name"]: e for e in container["env"]}


def test_tfjob_is_valid_for_the_crd_and_the_core_schemas(tmp_path,
                                                         tfjob_schema):
    tfjob, policy = _render(tmp_path, "--backend", "tfjob", *COMMON,
                            "--gpus-per-worker", "1", "--pvc", "shared")
    assert (tfjob["apiVersion"], tfjob["kind"]) == ("kubeflow.org/v1",
                                                    "TFJob")
    validator = jsonschema.Draft7Validator(tfjob_schema)
    errors = [f"{list(e.path)}: {e.message}"
              for e in validator.iter_errors(tfjob)]
    assert not errors, errors
    # The strict schema does catch a misspelt field.
    broken = json.loads(json.dumps(tfjob))
    broken["spec"]["runPolicy"]["cleanPodPolicyy"] = "Running"
    assert not validator.is_valid(broken)
    # Each replica's pod template is a valid core Pod.
    for rtype, spec in tfjob["spec"]["tfReplicaSpecs"].items():
        _validate_core({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": f"ctr-{rtype.lower()}-0",
                                     **spec["template"]["metadata"]},
                        "spec": spec["template"]["spec"]})
    _validate_core(policy)


def _subclasses(kind: type) -> set[type]:
    found = set(kind.__subclasses__())
    for sub in list(found):
        found |= _subclasses(sub)
    return found | {kind}


def test_tfjob_semantics(tmp_path):
    tfjob, _ = _render(tmp_path, "--backend", "tfjob", *COMMON,
                       "--gpus-per-worker", "2", "--", "--steps", "1000",
                       "--model", "deepfm")
    spec = tfjob["spec"]
    assert spec["runPolicy"]["cleanPodPolicy"] == "Running"
    replicas = spec["tfReplicaSpecs"]
    assert list(replicas) == ["Chief", "PS", "Worker"]  # no Evaluator
    assert [replicas[r]["replicas"] for r in replicas] == [1, 2, 3]
    for rtype, replica in replicas.items():
        container = _container(replica["template"])
        assert container["name"] == "tensorflow"
        assert replica["restartPolicy"] == "ExitCode"
        env = _env(container)
        assert env["GRPC_FAIL_FAST"]["value"] == "use_caller"
        assert env["TF_USE_LEGACY_KERAS"]["value"] == "1"
        assert "TF_CONFIG" not in env  # the operator sets it
        assert container["command"] == ["psrec"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["tfjob-port"] == 2222
    # ExitCode retries exactly the codes >= 128 (the operator's code):
    # psrec's retryable codes are all >= 128, its permanent ones below.
    assert all(code >= 128 for code in RETRYABLE_EXIT_CODES)
    named = {name: code for name, code in vars(errors).items()
             if name.startswith("EXIT_")}
    assert {"EXIT_FAILURE", "EXIT_USAGE", "EXIT_RETRYABLE"} <= set(named)
    for name, code in named.items():
        assert errors.is_retryable(code) == (code >= 128), (name, code)
    for kind in _subclasses(errors.PsrecError):
        code = kind.exit_code
        assert errors.is_retryable(code) == (code >= 128), (kind, code)
    chief = _container(replicas["Chief"]["template"])
    args = chief["args"]
    assert args[0] == "train" and "--allow-remote" in args
    assert args[args.index("--data") + 1] == "gs://bucket/criteo/tfrecord"
    assert args[args.index("--workers") + 1] == "3"
    assert args[args.index("--ps") + 1] == "2"
    assert args[args.index("--metrics-host") + 1] == "0.0.0.0"
    # The coordinator checks the sharding plan against the PS pods' limit.
    assert args[args.index("--ps-memory") + 1] == "6Gi"
    assert args[-4:] == ["--steps", "1000", "--model", "deepfm"]
    metrics = {p["name"]: p["containerPort"] for p in chief["ports"]}
    assert metrics["metrics"] == int(args[args.index("--metrics-port") + 1])
    for probe in ("startupProbe", "livenessProbe"):
        assert chief[probe]["httpGet"] == {"path": "/healthz",
                                           "port": "metrics"}
    scrape = replicas["Chief"]["template"]["metadata"]["annotations"]
    assert scrape == {"prometheus.io/scrape": "true",
                      "prometheus.io/port": str(metrics["metrics"]),
                      "prometheus.io/path": "/metrics"}
    for rtype in ("PS", "Worker"):  # nothing to scrape there
        assert "annotations" not in replicas[rtype]["template"]["metadata"]
    for rtype in ("PS", "Worker"):
        container = _container(replicas[rtype]["template"])
        assert container["args"] == ["server", "--allow-remote"]
        for probe in ("startupProbe", "livenessProbe"):
            assert container[probe]["tcpSocket"] == {"port": "tfjob-port"}
    ps = _container(replicas["PS"]["template"])
    worker = _container(replicas["Worker"]["template"])
    assert ps["resources"]["limits"] == {"memory": "6Gi"}
    assert _env(ps)["CUDA_VISIBLE_DEVICES"]["value"] == ""
    assert worker["resources"]["limits"] == {"nvidia.com/gpu": 2}
    assert "resources" not in chief


def test_operator_tf_config_format(tmp_path):
    tfjob, _ = _render(tmp_path, *COMMON)
    hosts = {kind: [f"ctr-{kind}-{i}.ml.svc:2222" for i in range(n)]
             for kind, n in (("chief", 1), ("ps", 2), ("worker", 3))}
    expected = {"cluster": hosts, "task": {"type": "worker", "index": 1},
                "environment": "cloud"}
    text = operator_tf_config(tfjob, "Worker", 1)
    assert text == json.dumps(expected, separators=(",", ":"))


def test_plain_objects_are_valid_and_map_exit_codes(tmp_path):
    objects = _render(tmp_path, "--backend", "plain", *COMMON)
    assert [o["kind"] for o in objects] == [
        "Service", "StatefulSet", "StatefulSet", "Job", "NetworkPolicy"]
    for item in objects:
        _validate_core(item)
    service, ps, worker, job, _ = objects
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    for sts, count in ((ps, 2), (worker, 3)):
        assert sts["spec"]["serviceName"] == service["metadata"]["name"]
        assert sts["spec"]["replicas"] == count
        assert sts["spec"]["podManagementPolicy"] == "Parallel"
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert all(labels[k] == v for k, v in
                   sts["spec"]["selector"]["matchLabels"].items())
        assert all(labels[k] == v for k, v in
                   service["spec"]["selector"].items())
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert _container(job["spec"]["template"])["name"] == "tensorflow"
    rules = {r["action"]: r for r in job["spec"]["podFailurePolicy"]["rules"]}
    fail = rules["FailJob"]["onExitCodes"]
    assert (fail["containerName"], fail["operator"]) == ("tensorflow", "In")
    assert sorted(fail["values"]) == [1, 2]
    assert 138 in rules["Count"]["onExitCodes"]["values"]
    assert rules["Ignore"]["onPodConditions"][0]["type"] == "DisruptionTarget"
    # TF_CONFIG per pod from its ordinal: each pod is its own task, at
    # its own DNS name, in one cluster shared by all.
    pods = {p.name: p for p in manifest_pods(objects)}
    assert sorted(pods) == ["ctr-chief-0", "ctr-ps-0", "ctr-ps-1",
                            "ctr-worker-0", "ctr-worker-1", "ctr-worker-2"]
    assert pods["ctr-worker-2"].task == ("worker", 2)
    assert pods["ctr-ps-1"].tf_config["cluster"]["ps"][1] == (
        "ctr-ps-1.ctr.ml.svc:2222")
    assert pods["ctr-chief-0"].task == ("chief", 0)


@pytest.mark.parametrize("backend", ["tfjob", "plain"])
def test_network_policy_admits_only_own_pods_and_monitoring(tmp_path,
                                                            backend):
    objects = _render(tmp_path, "--backend", backend, *COMMON,
                      "--monitoring-namespace", "observability",
                      "--metrics-port", "9400")
    [policy] = [o for o in objects if o["kind"] == "NetworkPolicy"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    templates = [spec["template"] for spec in objects[0]["spec"].get(
        "tfReplicaSpecs", {}).values()] + [
        o["spec"]["template"] for o in objects
        if o["kind"] in ("StatefulSet", "Job")]
    assert len(templates) == 3
    for template in templates:  # the policy covers every pod of the job
        labels = template["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in selector.items())
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    grpc, metrics = policy["spec"]["ingress"]
    assert grpc["from"] == [{"podSelector": {"matchLabels": selector}}]
    assert grpc["ports"] == [{"protocol": "TCP", "port": 2222}]
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "observability"}}}]
    assert metrics["ports"] == [{"protocol": "TCP", "port": 9400}]


def _quantity_bytes(text):
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", text).groups()
    return int(number) << (20 if unit == "Mi" else 30)


def test_ps_memory_is_planned_from_the_spec(tmp_path):
    from psrec.features.spec.presets import resolve_spec
    from psrec.models.ranking.config import model_config
    from psrec.ps_cluster.planner.plan import plan
    args = ["--name", "p", "--image", "i:1", "--workdir", "gs://b/w"]
    memory = {}
    for ps in (1, 4):
        tfjob, _ = _render(tmp_path, *args, "--ps", ps, "--", "--model",
                           "dcn", name=f"ps{ps}.yaml")
        ps_spec = tfjob["spec"]["tfReplicaSpecs"]["PS"]["template"]
        memory[ps] = _quantity_bytes(
            _container(ps_spec)["resources"]["limits"]["memory"])
    planned = plan(resolve_spec("criteo"), model_config("dcn"), 1)
    assert memory[1] >= math.ceil(planned.max_ps_bytes * 1.25)
    assert memory[4] < memory[1]  # the tables are split over the PS tasks


@pytest.mark.parametrize("extra, message", [
    (["--data", "gs://b/d"], "--ps-memory` is required with a remote"),
    (["--ps-memory", "8GB"], "not a Kubernetes memory quantity"),
    (["--ps-memory", "1Gi", "--", "--workers", "4"], "set by `psrec k8s"),
    (["--ps-memory", "1Gi", "--", "--stepz", "4"], "unrecognized"),
    (["--ps-memory", "1Gi", "--name", "Bad_Name"], "not a valid Kubernetes"),
    (["--ps-memory", "1Gi", "--metrics-port", "70000"], "1 to 65535"),
])
def test_render_refuses_with_one_line(tmp_path, capsys, extra, message):
    code = main(["k8s", "render", "--name", "j", "--image", "i:1",
                 "--workdir", "gs://b/w", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert message in err[-1], err


def test_dashboard_is_written_beside_the_manifest(tmp_path):
    _render(tmp_path, *COMMON)
    board = json.loads((tmp_path / "dashboard.json").read_text())
    assert board["panels"]
    assert "psrec_" in json.dumps(board)


# -- simulate -------------------------------------------------------------


def _simulate(tmp_path, backend, workers):
    manifest = tmp_path / f"{backend}.yaml"
    workdir = tmp_path / "run"
    assert main(["k8s", "render", "--backend", backend, "--name", "tiny",
                 "--image", "psrec:test", "--workers", str(workers),
                 "--ps", "1", "--workdir", str(workdir), "--ps-memory",
                 "1Gi", "--out", str(manifest), "--", *TINY]) == 0
    logs = tmp_path / "logs"
    code, run = run_psrec(["k8s", "simulate", manifest, "--timeout", "240",
                           "--log-dir", logs, "--json"], timeout=300)
    _assert_pods_stopped(run, 2 + workers)
    return code, run, workdir, logs


def _assert_pods_stopped(run, pods):
    pids = [int(p) for p in re.findall(r"simulate: pod .* pid (\d+)$",
                                       run.output, re.MULTILINE)]
    assert len(pids) == pods, run.output[-2000:]
    assert not [p for p in pids if pid_alive(p)]


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.parametrize("backend, workers", [("tfjob", 1), ("plain", 2)])
def test_simulated_pods_form_a_cluster_that_trains(tmp_path, backend,
                                                   workers):
    code, run, workdir, logs = _simulate(tmp_path, backend, workers)
    assert code == 0, run.output[-3000:]
    result = json.loads(run.output.strip().splitlines()[-1])
    assert result["exit_code"] == 0
    assert result["coordinator"] == "tiny-chief-0"
    assert len(result["addresses"]) == 2 + workers
    # Every probe of every pod passed at least once (kubelet's view).
    assert result["probes"] and all(
        at is not None for at in result["probes"].values()), result
    assert (workdir / "checkpoints" / "ckpt-10.index").is_file()
    chief_log = (logs / "tiny-chief-0.log").read_text()
    assert "coordinating existing cluster" in chief_log
    server_log = (logs / "tiny-ps-0.log").read_text()
    assert "private network namespace" in server_log


@pytest.mark.cluster
def test_simulate_exits_with_the_coordinators_code(tmp_path):
    """A coordinator that refuses its arguments (exit 2, permanent): the
    simulation exits 2 too and stops the PS and worker pods."""
    objects = _render(tmp_path, "--name", "bad", "--image", "psrec:test",
                      "--workers", "1", "--ps", "1", "--workdir",
                      tmp_path / "run", "--ps-memory", "1Gi")
    chief = _container(objects[0]["spec"]["tfReplicaSpecs"]["Chief"][
        "template"])
    chief["args"] += ["--batch-size", "0"]
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(yaml.safe_dump_all(objects))
    code, run = run_psrec(["k8s", "simulate", manifest, "--log-dir",
                           tmp_path / "logs"], timeout=120)
    assert code == 2, run.output[-2000:]
    assert "coordinator bad-chief-0 exited 2" in run.output
    assert "--batch-size" in run.output  # its log tail says why
    _assert_pods_stopped(run, 3)
