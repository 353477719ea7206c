"""Every YAML shipped in deploy/ is checked the way its consumer would check it, offline.

- Ray cluster-launcher configs (`ray up`): Ray's own check, `validate_config(prepare_config())`
  from ray.autoscaler._private.util, exactly what `ray up` runs before it reaches a cloud
  (prepare_config fills in the provider's defaults.yaml and the node types, all offline; the
  steps after it need cloud credentials: resource autodetection and the provider's
  bootstrap). For GCP the offline part of that bootstrap runs too, where
  google-api-python-client is installed (Ray's GCP module imports it): Ray's legacy-field check
  and its node-type parser, which validates TPU accelerator configs.
- KubeRay RayCluster manifests: against the fields of the RayCluster CRD they use (a subset of
  its schema below, with the CRD's types), as the API server would; no CRD is installed here.
- Sweep YAMLs (deploy/sweeps/, deploy/cron/): against the API's SweepSpec via load_spec.
- Each cluster can host every trial of the sweep it pairs with (SWEEPS_OF below): enough chips
  of the sweep's kind, and for TPUs a node type that is the slice a trial reserves.
"""

from __future__ import annotations

import copy
import json
import math
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from service.core.config import Settings
from service.runs.sweep_file import load_spec
from workers.options import CPU_CHIP_RESOURCE
from workers.placement import tpu_topology

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"

SWEEPS_OF = {
    "cluster-cpu.yaml": ["sweeps/cpu-scaling.yaml"],
    "cluster-gcp-h100.yaml": ["sweeps/nightly-h100.yaml"],
    "cluster-gcp-tpu-v5p.yaml": ["sweeps/v5p-long-context.yaml"],
    "cluster-gcp-tpu-v6e.yaml": [],
    "raycluster-gpu.yaml": ["sweeps/nightly-h100.yaml"],
    "raycluster-tpu-v5p.yaml": ["sweeps/v5p-long-context.yaml"],
}
"""Each cluster file in deploy/ and the sweeps shipped to run on it."""

GPU_OF_MACHINE = {"a3-highgpu-8g": "h100", "a3-megagpu-8g": "h100", "a3-ultragpu-8g": "h200"}
"""GCP machine types and the GPU they come with."""
GPU_OF_GKE_ACCELERATOR = {"nvidia-h100-80gb": "h100", "nvidia-h100-mega-80gb": "h100",
                          "nvidia-h200-141gb": "h200"}
TPU_OF_GKE_ACCELERATOR = {"tpu-v4-podslice": "v4", "tpu-v5-lite-podslice": "v5e",
                          "tpu-v5p-slice": "v5p", "tpu-v6e-slice": "v6e"}


def _yaml_files(*patterns: str) -> list[Path]:
    return sorted(p for pattern in patterns for p in DEPLOY.glob(pattern))


def _kind(doc) -> str:
    if isinstance(doc, dict) and "provider" in doc and "cluster_name" in doc:
        return "launcher"
    if isinstance(doc, dict) and str(doc.get("apiVersion", "")).startswith("ray.io/"):
        return "kuberay"
    if isinstance(doc, dict) and "services" in doc:
        return "compose"  # deploy/compose.yaml: tests/deploy/test_container.py checks it
    return "unknown"


CLUSTER_FILES = {p.name: yaml.safe_load(p.read_text()) for p in _yaml_files("*.yaml", "*.yml")}
LAUNCHERS = sorted(n for n, d in CLUSTER_FILES.items() if _kind(d) == "launcher")
KUBERAYS = sorted(n for n, d in CLUSTER_FILES.items() if _kind(d) == "kuberay")
SWEEP_FILES = _yaml_files("sweeps/*.yaml", "sweeps/*.yml", "cron/*.yaml", "cron/*.yml")


def test_every_yaml_in_deploy_is_a_kind_these_tests_check():
    unknown = [n for n, d in CLUSTER_FILES.items() if _kind(d) == "unknown"]
    assert not unknown, f"deploy/{unknown}: neither a launcher config, a RayCluster nor compose"
    assert sorted(SWEEPS_OF) == sorted(LAUNCHERS + KUBERAYS), \
        "every cluster file in deploy/ must be listed in SWEEPS_OF (with [] if no sweep pairs)"
    assert {"launcher", "kuberay"} <= {_kind(d) for d in CLUSTER_FILES.values()}


# --- Ray cluster launcher ------------------------------------------------------------------

def check_launcher_config(doc: dict) -> dict:
    """`ray up`'s own check of a config (before it needs a cloud); the prepared config."""
    config = prepare_config(copy.deepcopy(doc))
    validate_config(config)
    return config


@pytest.mark.parametrize("name", LAUNCHERS)
def test_launcher_config_passes_rays_own_validation(name):
    config = check_launcher_config(CLUSTER_FILES[name])
    starts = config["head_start_ray_commands"] + config["worker_start_ray_commands"]
    assert all("RAY_AUTH_MODE=token" in c for c in starts if "ray start" in c), \
        "every node starts with token authentication (deploy/README.md)"
    assert config["file_mounts"].get("~/.ray/auth_token") == "~/.ray/auth_token"
    assert any("echo 'export RAY_AUTH_MODE=token' >> ~/.bashrc" in c
               for c in config["setup_commands"]), "the nodes' shells are token-mode clients"


@pytest.mark.parametrize("name", LAUNCHERS)
def test_launcher_setup_installs_the_builds_of_its_chips(name):
    """This package, torch 2.13.0 (the CPU wheel unless the nodes have GPUs) and JAX's
    plugin for the chips (none on CPU)."""
    config = check_launcher_config(CLUSTER_FILES[name])
    setup = "\n".join(config["setup_commands"])
    chips = {resource for group in node_groups(CLUSTER_FILES[name])
             for resource in group["resources"]} & {"GPU", "TPU", CPU_CHIP_RESOURCE}
    assert "-e ~/gdn-sweep" in setup and "torch==2.13.0" in setup
    cpu_torch = "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in setup
    assert cpu_torch == ("GPU" not in chips), setup
    assert ("jax[cuda12]" in setup) == ("GPU" in chips)
    assert ("jax[tpu]" in setup) == ("TPU" in chips)


@pytest.mark.parametrize("name", [n for n in LAUNCHERS
                                  if CLUSTER_FILES[n]["provider"]["type"] == "gcp"])
def test_gcp_config_passes_the_offline_part_of_rays_gcp_bootstrap(name):
    """Ray's GCP legacy-field check and node-type parser (it validates TPU acceleratorConfig:
    V<generation>, AxB[xC]). They import the Google API client, which `ray up` on GCP needs
    on the client too (`pip install google-api-python-client`)."""
    from ray.autoscaler._private.gcp.config import (GCPNodeType, check_legacy_fields,
                                                    get_node_type)

    config = check_launcher_config(CLUSTER_FILES[name])
    check_legacy_fields(copy.deepcopy(config))
    kinds = {n: get_node_type(t["node_config"]) for n, t in
             config["available_node_types"].items()}
    assert kinds[config["head_node_type"]] == GCPNodeType.COMPUTE


def test_rays_validation_rejects_an_unquoted_resources_json():
    """The check above is the one that failed on the first cluster-cpu.yaml: an unquoted
    `--resources='{"cpu_chip": 8}'` is a YAML mapping, not a start command."""
    text = (DEPLOY / "cluster-cpu.yaml").read_text()
    broken = text.replace("""'RAY_AUTH_MODE=token ray start --address=$RAY_HEAD_IP:6379 """
                          """--resources=''{"cpu_chip": 8}'''""",
                          """RAY_AUTH_MODE=token ray start --address=$RAY_HEAD_IP:6379 """
                          """--resources='{"cpu_chip": 8}'""")
    assert broken != text
    with pytest.raises(jsonschema.ValidationError, match="is not of type 'string'"):
        check_launcher_config(yaml.safe_load(broken))


# --- KubeRay ---------------------------------------------------------------------------------

_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_INT32 = {"type": "integer", "minimum": -2**31, "maximum": 2**31 - 1}
_QUANTITY = {"type": "string", "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
             r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"}
"""Kubernetes' quantity pattern; the CRD also takes integers, the manifests here quote them."""


def _closed(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False}


_CONTAINER = _closed({
    "name": {"type": "string"}, "image": {"type": "string"},
    "resources": _closed({"limits": {"type": "object", "additionalProperties": _QUANTITY},
                          "requests": {"type": "object", "additionalProperties": _QUANTITY}}),
    "ports": {"type": "array", "items": _closed(
        {"containerPort": _INT32, "name": {"type": "string"}}, ("containerPort",))},
}, ("name",))
_POD_TEMPLATE = _closed({"spec": _closed({
    "containers": {"type": "array", "minItems": 1, "items": _CONTAINER},
    "nodeSelector": _STRINGS,
}, ("containers",))})
RAYCLUSTER_SUBSET_SCHEMA = _closed({
    "apiVersion": {"const": "ray.io/v1"},
    "kind": {"const": "RayCluster"},
    "metadata": _closed({"name": {"type": "string"}}, ("name",)),
    "spec": _closed({
        "rayVersion": {"type": "string"},
        "authOptions": _closed({"mode": {"enum": ["disabled", "token"]},
                                "secretName": {"type": "string"},
                                "enableK8sTokenAuth": {"type": "boolean"}}),
        "headGroupSpec": _closed({"rayStartParams": _STRINGS, "resources": _STRINGS,
                                  "template": _POD_TEMPLATE}, ("template",)),
        "workerGroupSpecs": {"type": "array", "items": _closed({
            "groupName": {"type": "string"}, "replicas": _INT32, "minReplicas": _INT32,
            "maxReplicas": _INT32, "numOfHosts": _INT32, "rayStartParams": _STRINGS,
            "resources": _STRINGS, "template": _POD_TEMPLATE,
        }, ("groupName", "maxReplicas", "minReplicas", "template"))},
    }, ("headGroupSpec",)),
}, ("apiVersion", "kind", "metadata", "spec"))
"""The fields of KubeRay v1.7.0's RayCluster CRD (ray-operator/config/crd/bases/
ray.io_rayclusters.yaml, version v1) that the manifests here use, with the CRD's types
(rayStartParams and resources: maps of strings; counts int32; authOptions.mode an enum).
Closed: a field outside this subset fails until it is added here from the CRD."""


@pytest.mark.parametrize("name", KUBERAYS)
def test_kuberay_manifest_uses_crd_fields_with_their_types(name):
    doc = CLUSTER_FILES[name]
    jsonschema.validate(doc, RAYCLUSTER_SUBSET_SCHEMA)
    spec = doc["spec"]
    assert spec["rayVersion"] == "2.60.0"
    assert spec.get("authOptions", {}).get("mode") == "token", "token auth (deploy/README.md)"
    for group in spec["workerGroupSpecs"]:
        assert group["minReplicas"] <= group.get("replicas", 0) <= group["maxReplicas"], \
            group["groupName"]


def test_kuberay_subset_schema_rejects_what_kubernetes_would():
    doc = copy.deepcopy(CLUSTER_FILES["raycluster-gpu.yaml"])
    doc["spec"]["headGroupSpec"]["rayStartParams"]["num-gpus"] = 0  # an int: not a string
    with pytest.raises(jsonschema.ValidationError, match="is not of type 'string'"):
        jsonschema.validate(doc, RAYCLUSTER_SUBSET_SCHEMA)
    doc = copy.deepcopy(CLUSTER_FILES["raycluster-gpu.yaml"])
    doc["spec"]["workerGroupSpecs"][0]["maxReplica"] = 8  # a misspelt field
    with pytest.raises(jsonschema.ValidationError, match="maxReplica"):
        jsonschema.validate(doc, RAYCLUSTER_SUBSET_SCHEMA)


# --- sweeps ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", SWEEP_FILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_sweep_yaml_is_a_valid_sweep_spec(path):
    spec = load_spec(path, grid_cap=Settings().grid_cap)
    assert spec.chips and spec.accelerator.kind in ("cpu", "gpu", "tpu")


# --- the trials a paired sweep asks for fit the cluster -------------------------------------

def _start_resources(command: str) -> dict:
    for word in shlex.split(command):
        if word.startswith("--resources="):
            return json.loads(word.split("=", 1)[1])
    return {}


def _tpu_pod_type(version: str, topology: str) -> str:
    from ray._private.accelerators.tpu import infer_tpu_pod_type_from_topology

    return infer_tpu_pod_type_from_topology(topology, f"TPU-{version.upper()}")


def node_groups(doc: dict) -> list[dict]:
    """Each kind of node of a cluster file: resources per host, hosts per node, most nodes,
    and what it is (gpu: the GPU model; tpu_pod_type: the slice, e.g. v5p-16)."""
    if _kind(doc) == "kuberay":
        groups = []
        for group in doc["spec"]["workerGroupSpecs"]:
            pod = group["template"]["spec"]
            limits = pod["containers"][0].get("resources", {}).get("limits", {})
            selector = pod.get("nodeSelector", {})
            resources, entry = {}, {"name": group["groupName"]}
            if "nvidia.com/gpu" in limits:
                resources["GPU"] = int(limits["nvidia.com/gpu"])
                entry["gpu"] = GPU_OF_GKE_ACCELERATOR.get(
                    selector.get("cloud.google.com/gke-accelerator"))
            if "google.com/tpu" in limits:
                resources["TPU"] = int(limits["google.com/tpu"])
                entry["tpu_pod_type"] = _tpu_pod_type(
                    TPU_OF_GKE_ACCELERATOR[selector["cloud.google.com/gke-tpu-accelerator"]],
                    selector["cloud.google.com/gke-tpu-topology"])
            groups.append(entry | {"resources": resources, "hosts": group.get("numOfHosts", 1),
                                   "max_nodes": group["maxReplicas"]})
        return groups
    config = prepare_config(copy.deepcopy(doc))
    if config["provider"]["type"] == "local":
        provider = config["provider"]
        head = _start_resources(" ".join(config["head_start_ray_commands"]))
        worker = _start_resources(" ".join(config["worker_start_ray_commands"]))
        return [{"name": "head", "resources": head, "hosts": 1, "max_nodes": 1},
                {"name": "workers", "resources": worker, "hosts": 1,
                 "max_nodes": len(provider.get("worker_ips", []))}]
    groups = []
    for name, node_type in config["available_node_types"].items():
        node_config, resources = node_type["node_config"], node_type.get("resources", {})
        entry = {"name": name, "resources": resources, "hosts": 1,
                 "max_nodes": 1 if name == config["head_node_type"] else node_type["max_workers"]}
        if "acceleratorConfig" in node_config:
            accelerator = node_config["acceleratorConfig"]
            pod_type = _tpu_pod_type(accelerator["type"], accelerator["topology"])
            chips = math.prod(map(int, accelerator["topology"].split("x")))
            entry |= {"tpu_pod_type": pod_type, "hosts": chips // resources.get("TPU", chips)}
        if "machineType" in node_config:
            entry["gpu"] = GPU_OF_MACHINE.get(node_config["machineType"])
        groups.append(entry)
    return groups


def unhostable_trials(doc: dict, spec) -> list[str]:
    """The sweep's chip counts that no scale of this cluster could place, and why."""
    kind, accel = spec.accelerator.kind, spec.accelerator.type.lower()
    groups = node_groups(doc)
    problems = []
    for chips in sorted(set(spec.chips)):
        if kind == "tpu":
            wanted = _tpu_pod_type(accel, tpu_topology(accel, chips))
            if not any(g.get("tpu_pod_type") == wanted and g["max_nodes"] >= 1 for g in groups):
                problems.append(f"{chips} {accel} chips reserve a {wanted} slice: no node type "
                                f"is one (have {[g.get('tpu_pod_type') for g in groups]})")
            continue
        resource = CPU_CHIP_RESOURCE if kind == "cpu" else "GPU"
        usable = [g for g in groups if kind == "cpu" or g.get("gpu") == accel]
        total = sum(g["resources"].get(resource, 0) * g["hosts"] * g["max_nodes"]
                    for g in usable)
        if total < chips:
            problems.append(f"{chips} chips of {resource} ({accel}): the cluster has at most "
                            f"{total:g}")
    return problems


PAIRS = [(cluster, sweep) for cluster, sweeps in SWEEPS_OF.items() for sweep in sweeps]


@pytest.mark.parametrize("cluster,sweep", PAIRS)
def test_cluster_can_host_every_trial_of_its_sweep(cluster, sweep):
    spec = load_spec(DEPLOY / sweep)
    assert unhostable_trials(CLUSTER_FILES[cluster], spec) == []


def test_hosting_check_finds_a_cluster_too_small():
    spec = load_spec(DEPLOY / "sweeps/nightly-h100.yaml")  # up to 16 chips, 8 GPUs a host
    doc = copy.deepcopy(CLUSTER_FILES["cluster-gcp-h100.yaml"])
    doc["available_node_types"]["h100x8"]["max_workers"] = 1
    assert unhostable_trials(doc, spec) == [
        "16 chips of GPU (h100): the cluster has at most 8"]
    doc = copy.deepcopy(CLUSTER_FILES["raycluster-tpu-v5p.yaml"])
    del doc["spec"]["workerGroupSpecs"][0]  # the 2x2x1 slice
    problems = unhostable_trials(doc, load_spec(DEPLOY / "sweeps/v5p-long-context.yaml"))
    assert len(problems) == 1 and "v5p-8 slice" in problems[0]


@pytest.mark.parametrize("name", [n for n in LAUNCHERS + KUBERAYS if "tpu" in n])
def test_tpu_node_types_advertise_their_slice(name):
    """Each TPU host advertises its chips, and (launcher) host 0 the slice's head resource
    that a SlicePlacementGroup reserves first, so the autoscaler can start the slice."""
    from ray._private.accelerators.tpu import get_num_tpu_visible_chips_per_host

    slices = [g for g in node_groups(CLUSTER_FILES[name]) if "tpu_pod_type" in g]
    assert slices, f"{name} has no TPU node type"
    for group in slices:
        pod_type = group["tpu_pod_type"]
        assert group["resources"]["TPU"] == get_num_tpu_visible_chips_per_host(pod_type), group
        if _kind(CLUSTER_FILES[name]) == "launcher":
            assert group["resources"].get(f"TPU-{pod_type}-head") == 1, group
        assert re.fullmatch(r"v\d+[a-z]*-\d+", pod_type)
