"""Shared by the deploy tests: where the chart, helm and checkov are, and rendering."""
import os
import subprocess

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHART = os.path.join(ROOT, "deploy/helm/kvmesh")
PROFILES = {
    "cpu": os.path.join(CHART, "values-cpu.yaml"),
    "gpu": os.path.join(CHART, "values-gpu.yaml"),
    "gpu-disagg-tp2": os.path.join(CHART, "values-gpu-disagg-tp2.yaml"),
}
RELEASE = "kvmesh"
NAMESPACE = "kvmesh"
# The CPU profile with the cluster KV store on: two stores, every worker with a host tier
# (which --kv-store needs) and the store's API key from a rendered Secret.
KV_STORE = ("--set", "kvStore.enabled=true", "--set", "kvStore.replicas=2", "--set", "kvStore.capacityBytes=67108864",
            "--set", "workers.prefill.kvHostCacheBytes=33554432", "--set", "workers.decode.kvHostCacheBytes=33554432",
            "--set", "kvStore.apiKey.enabled=true", "--set", "kvStore.apiKey.key=store-key")


def _tool(installer):
    path = subprocess.run([os.path.join(ROOT, "deploy/tools", installer), "--path"], capture_output=True,
                          text=True, check=True).stdout.strip()
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing: tools/setup installs it (deploy/tools/{installer})")
    return path


def helm():
    return _tool("install-helm")


def checkov():
    return _tool("install-checkov")


def run_helm(*args, check=True):
    result = subprocess.run([helm(), *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def render_text(profile, *extra):
    return run_helm("template", RELEASE, CHART, "--namespace", NAMESPACE, "-f", PROFILES[profile], *extra).stdout


def render(profile, *extra):
    return [d for d in yaml.safe_load_all(render_text(profile, *extra)) if d]


def find(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return found
