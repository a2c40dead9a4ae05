"""The Helm chart (deploy/helm/kvmesh) is valid for its three value sets, and for the CPU
one with the cluster KV store on: helm lint and template are clean, every manifest
validates against a current Kubernetes release's OpenAPI schemas (kubernetes-validate),
checkov's Kubernetes checks pass (each skipped check below with its reason), and what the
issue asks of each object is there."""
import json
import os
import re
import subprocess
import tempfile

import kubernetes_validate
import pytest
import yaml

from deploy_common import CHART, KV_STORE, NAMESPACE, PROFILES, ROOT, checkov, find, render, render_text, run_helm

# checkov checks skipped for every profile, and why. The test fails if one is no longer
# needed (so the list cannot rot) or if any other check fails.
SKIPPED_CHECKS = {
    "CKV_K8S_15": "Image pull policy Always: images are versioned and immutable (tag = chart appVersion); "
                  "IfNotPresent keeps scale-out off the registry's critical path. Set image.pullPolicy=Always "
                  "to opt in.",
    "CKV_K8S_43": "Image by digest: the chart cannot know the digest of an image built later; set "
                  "image.tag to '<tag>@sha256:<digest>' to pin one.",
}
# Skipped only for the renderings that turn on what trips them (and needed there).
RENDERING_SKIPPED_CHECKS = {
    "cpu-kv-store": {
        "CKV_K8S_35": "Secrets as files: kvmesh takes API keys as flag values (KVMESH_<FLAG> variables set their "
                      "defaults), not from files, as the router's apiKeys does; the variable comes from a "
                      "secretKeyRef, never a literal in the manifest.",
    },
}
# Prometheus Operator CRDs: not part of Kubernetes' OpenAPI, checked structurally below.
CRD_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
K8S_VERSION = kubernetes_validate.latest_version()
ALL_MONITORS = ("--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.podMonitor.enabled=true",
                "--set", "monitoring.prometheusRule.enabled=true")
# name -> (profile, extra helm arguments): the three profiles and the CPU one with the kv-store.
RENDERINGS = {**{p: (p, ()) for p in PROFILES}, "cpu-kv-store": ("cpu", KV_STORE)}


@pytest.mark.parametrize("rendering", RENDERINGS)
def test_helm_lint_is_clean(rendering):
    profile, extra = RENDERINGS[rendering]
    out = run_helm("lint", "--strict", CHART, "-f", PROFILES[profile], *extra).stdout
    assert "0 chart(s) failed" in out, out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out


@pytest.mark.parametrize("rendering", RENDERINGS)
def test_every_manifest_validates_against_kubernetes(rendering):
    profile, extra = RENDERINGS[rendering]
    docs = render(profile, *ALL_MONITORS, *extra)
    checked = 0
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} ({profile}) is invalid for Kubernetes "
                        f"{K8S_VERSION}: {e.message} at {list(e.path)}")
        checked += 1
    assert checked >= 10, f"only {checked} objects rendered"


@pytest.mark.parametrize("rendering", RENDERINGS)
def test_monitoring_crds_are_well_formed(rendering):
    profile, extra = RENDERINGS[rendering]
    docs = render(profile, *ALL_MONITORS, *extra)
    kinds = {d["kind"]: d for d in docs if d["kind"] in CRD_KINDS}
    assert set(kinds) == CRD_KINDS
    for d in kinds.values():
        assert d["apiVersion"] == "monitoring.coreos.com/v1"
    ports = {e["port"] for e in kinds["PodMonitor"]["spec"]["podMetricsEndpoints"]}
    assert ports == {"http", "metrics"}
    # Every pod names the ports the monitors scrape.
    for pod in find(docs, "Deployment") + find(docs, "StatefulSet"):
        names = {p["name"] for c in pod["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        assert names & ports, pod["metadata"]["name"]
    # The kvmesh_component / pod labels the dashboard and rules rely on.
    relabel = {r["targetLabel"] for e in kinds["PodMonitor"]["spec"]["podMetricsEndpoints"]
               for r in e["relabelings"]}
    assert {"kvmesh_component", "pod"} <= relabel
    # The PrometheusRule's spec is a rule file promtool accepts.
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(kinds["PrometheusRule"]["spec"], f)
        f.flush()
        result = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("rendering", RENDERINGS)
def test_checkov_kubernetes_checks_pass(rendering):
    profile, extra = RENDERINGS[rendering]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, f"{rendering}.yaml")
        with open(path, "w") as f:
            f.write(render_text(profile, *ALL_MONITORS, *extra))
        result = subprocess.run([checkov(), "-f", path, "--framework", "kubernetes", "--skip-download", "--quiet",
                                 "--compact", "-o", "json"], capture_output=True, text=True, timeout=600)
    report = json.loads(result.stdout)
    failed = report["results"]["failed_checks"]
    skipped = {**SKIPPED_CHECKS, **RENDERING_SKIPPED_CHECKS.get(rendering, {})}
    unexpected = sorted({(f["check_id"], f["check_name"], f["resource"]) for f in failed
                         if f["check_id"] not in skipped})
    assert not unexpected, "checkov failures:\n" + "\n".join(map(str, unexpected))
    assert report["summary"]["passed"] > 100, report["summary"]
    still_needed = {f["check_id"] for f in failed}
    assert still_needed == set(skipped), f"skip list out of date: needed {still_needed}"


def _pod_spec(docs, kind, name):
    (obj,) = find(docs, kind, name)
    return obj["spec"]["template"]["spec"]


def _args(container):
    return dict(a[2:].split("=", 1) for a in container["args"] if a.startswith("--") and "=" in a)


def test_cpu_profile_is_disaggregated_without_gpus():
    docs = render("cpu")
    sets = {s["metadata"]["name"] for s in find(docs, "StatefulSet")}
    assert sets == {"kvmesh-prefill", "kvmesh-decode"}
    for name in sets:
        (svc,) = find(docs, "Service", name)
        assert svc["spec"]["clusterIP"] == "None"  # headless: stable pod DNS names
        spec = _pod_spec(docs, "StatefulSet", name)
        (c,) = spec["containers"]
        assert "nvidia.com/gpu" not in json.dumps(c["resources"])
        assert _args(c)["device"] == "cpu"
        assert _args(c)["worker-id"] == "$(POD_NAME)"
    assert not find(docs, "HorizontalPodAutoscaler")


@pytest.mark.parametrize("profile,groups,tp", [("gpu", {"kvmesh-aggregated": "both"}, 1),
                                               ("gpu-disagg-tp2", {"kvmesh-prefill": "prefill",
                                                                   "kvmesh-decode": "decode"}, 2)])
def test_gpu_workers_request_tp_gpus_with_shm_selectors_and_hpa(profile, groups, tp):
    docs = render(profile)
    assert {s["metadata"]["name"] for s in find(docs, "StatefulSet")} == set(groups)
    for name, role in groups.items():
        spec = _pod_spec(docs, "StatefulSet", name)
        (c,) = spec["containers"]
        args = _args(c)
        assert args["role"] == role and args["device"] == "cuda" and args["tensor-parallel-size"] == str(tp)
        assert c["resources"]["limits"]["nvidia.com/gpu"] == tp
        assert c["resources"]["requests"]["nvidia.com/gpu"] == tp
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
        (shm,) = [v for v in spec["volumes"] if v["name"] == "dshm"]
        assert shm["emptyDir"]["medium"] == "Memory"
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
        (hpa,) = find(docs, "HorizontalPodAutoscaler", name)
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name}
        assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "kvmesh_num_requests_waiting"
        assert find(docs, "PodDisruptionBudget", name)


@pytest.mark.parametrize("rendering", RENDERINGS)
def test_probes_and_drain_match(rendering):
    profile, extra = RENDERINGS[rendering]
    docs = render(profile, *extra)
    values = yaml.safe_load(open(os.path.join(CHART, "values.yaml")))
    values["drain"].update(yaml.safe_load(open(PROFILES[profile])).get("drain", {}))
    drain = values["drain"]
    for obj in find(docs, "Deployment") + find(docs, "StatefulSet"):
        spec = obj["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert probe in c, (obj["metadata"]["name"], probe)
        assert c["lifecycle"]["preStop"]["sleep"]["seconds"] == drain["preStopSleepSeconds"]
        assert spec["terminationGracePeriodSeconds"] == (drain["preStopSleepSeconds"] + drain["timeoutSeconds"] +
                                                         drain["marginSeconds"])
        args = _args(c)
        timeout = args.get("drain-timeout-ms") or args.get("shutdown-grace-ms")
        assert timeout == str(drain["timeoutSeconds"] * 1000), obj["metadata"]["name"]
        if obj["metadata"]["name"] == "kvmesh-kv-store":
            # As the scheduler: gRPC health (NOT_SERVING from SIGTERM on), /health to live.
            grpc_port = {p["name"]: p["containerPort"] for p in c["ports"]}["grpc"]
            assert c["startupProbe"]["grpc"] == c["readinessProbe"]["grpc"] == {"port": grpc_port}
            assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "metrics"}
        elif obj["kind"] == "StatefulSet":
            assert c["startupProbe"]["httpGet"]["path"] == "/health"
            assert c["readinessProbe"]["httpGet"]["path"] == "/health"
            assert c["livenessProbe"]["httpGet"]["path"] == "/live"


def test_network_policies_isolate_the_components():
    docs = render("cpu", "--set-json", 'networkPolicy.routerIngressFrom=[{"namespaceSelector":{"matchLabels":'
                  '{"kubernetes.io/metadata.name":"clients"}}}]')
    policies = {p["metadata"]["name"]: p["spec"] for p in find(docs, "NetworkPolicy")}
    assert set(policies) == {"kvmesh-router", "kvmesh-scheduler", "kvmesh-workers"}
    router = policies["kvmesh-router"]["ingress"]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "clients"}}} in router[0]["from"]

    def sources(spec, port):
        rules = [r for r in spec["ingress"] if {"port": port, "protocol": "TCP"} in r["ports"]]
        return [json.dumps(f, sort_keys=True) for r in rules for f in r.get("from", [{"anywhere": True}])]

    scheduler = sources(policies["kvmesh-scheduler"], "grpc")
    workers = sources(policies["kvmesh-workers"], "grpc")
    assert any('"kvmesh.io/worker": "true"' in s for s in scheduler)
    assert any('"app.kubernetes.io/component": "router"' in s for s in scheduler)
    assert len(scheduler) == 2
    assert any('"kvmesh.io/worker": "true"' in s for s in workers) and len(workers) == 2
    assert all("anywhere" not in s for s in scheduler + workers)


def test_api_keys_and_tls_secrets():
    docs = render("cpu", "--set", "apiKeys.enabled=true", "--set", "apiKeys.keys={k1,k2}", "--set",
                  "tls.enabled=true", "--set", "tls.cert=CERT", "--set", "tls.key=KEY", "--set", "tls.ca=CA")
    (keys,) = find(docs, "Secret", "kvmesh-api-keys")
    assert keys["stringData"]["api-keys"] == "k1,k2"
    (tls,) = find(docs, "Secret", "kvmesh-tls")
    assert tls["type"] == "kubernetes.io/tls" and tls["stringData"]["tls.crt"] == "CERT"
    (router,) = _pod_spec(docs, "Deployment", "kvmesh-router")["containers"]
    env = {e["name"]: e for e in router["env"]}
    assert env["KVMESH_API_KEYS"]["valueFrom"]["secretKeyRef"] == {"name": "kvmesh-api-keys", "key": "api-keys"}
    assert env["KVMESH_TLS_CERT_FILE"]["value"] == "/etc/kvmesh/tls/tls.crt"
    for obj in find(docs, "Deployment") + find(docs, "StatefulSet"):
        assert any(v["name"] == "tls" for v in obj["spec"]["template"]["spec"]["volumes"])
    bad = run_helm("template", "x", CHART, "--set", "apiKeys.enabled=true", check=False)
    assert bad.returncode != 0 and "apiKeys.enabled needs apiKeys.keys" in bad.stderr


def test_schema_rejects_bad_values_with_a_clear_error():
    bad = run_helm("template", "x", CHART, "--set", "workers.prefill.device=tpu", check=False)
    assert bad.returncode != 0 and "/workers/prefill/device" in bad.stderr, bad.stderr
    bad = run_helm("template", "x", CHART, "--set", "workers.decode.tensorParallelSize=0", check=False)
    assert bad.returncode != 0 and "tensorParallelSize" in bad.stderr, bad.stderr


def test_model_configmap_and_dashboard_configmap():
    docs = render("cpu")
    (model,) = find(docs, "ConfigMap", "kvmesh-model")
    assert model["data"]["KVMESH_MODEL"] == "/opt/kvmesh/models/tiny-llama"
    (dash,) = find(docs, "ConfigMap", "kvmesh-dashboard")
    with open(os.path.join(ROOT, "deploy/grafana/kvmesh-dashboard.json")) as f:
        assert json.loads(dash["data"]["kvmesh-dashboard.json"]) == json.load(f)
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert all(d["metadata"]["namespace"] == NAMESPACE for d in docs)


def test_chart_copies_of_dashboard_and_rules_are_current():
    result = subprocess.run([os.path.join(ROOT, "deploy/grafana/generate-dashboard"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    with open(os.path.join(ROOT, "deploy/prometheus/kvmesh-rules.yaml")) as a, \
            open(os.path.join(CHART, "files/kvmesh-rules.yaml")) as b:
        assert a.read() == b.read(), "cp deploy/prometheus/kvmesh-rules.yaml deploy/helm/kvmesh/files/"


# ---- The cluster KV store (kvStore.*) ----

STORE_DNS = "kvmesh-kv-store-{}.kvmesh-kv-store.kvmesh.svc.cluster.local:50070"
# The tiny model the image ships (tools/make-tiny-model: 8 layers, 2 KV heads, head_dim 64,
# bf16 KV) in blocks of 16 tokens: 8 x 2 x 2 x 2 x 16 x 64 bytes.
TINY_BLOCK_BYTES = 65536


def _flags_declared(*sources):
    """Every ABSL_FLAG name the given source files declare, with dashes (as the chart
    spells them; the binaries accept either)."""
    names = set()
    for source in sources:
        with open(os.path.join(ROOT, source)) as f:
            names |= {n.replace("_", "-") for n in re.findall(r"ABSL_FLAG\(\s*[\w:<>]+\s*,\s*(\w+)\s*,", f.read())}
    return names


def _flag_names(container):
    return [a[2:].split("=", 1)[0] for a in container["args"] if a.startswith("--")]


def test_kv_store_is_off_by_default():
    for profile in PROFILES:
        docs = render(profile)
        assert not [d for d in docs if "kv-store" in d["metadata"]["name"]], profile
        for obj in find(docs, "StatefulSet"):
            (c,) = obj["spec"]["template"]["spec"]["containers"]
            assert not any(a.startswith("--kv-store") for a in c["args"]), obj["metadata"]["name"]


def test_kv_store_statefulset_service_pdb_and_secret():
    docs = render("cpu", *KV_STORE, "--set", "kvStore.memoryOverheadBytes=1048576")
    (sts,) = find(docs, "StatefulSet", "kvmesh-kv-store")
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["serviceName"] == "kvmesh-kv-store"
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "kv-store" and "kvmesh.io/worker" not in labels
    (svc,) = find(docs, "Service", "kvmesh-kv-store")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"grpc": 50070, "metrics": 9110}
    assert all(labels[k] == v for k, v in svc["spec"]["selector"].items())
    (pdb,) = find(docs, "PodDisruptionBudget", "kvmesh-kv-store")
    assert pdb["spec"]["maxUnavailable"] == 1 and pdb["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    spec = _pod_spec(docs, "StatefulSet", "kvmesh-kv-store")
    (c,) = spec["containers"]
    assert c["command"] == ["/opt/kvmesh/bin/kvmesh-kv-store"]
    args = _args(c)
    assert args["block-bytes"] == str(TINY_BLOCK_BYTES) and args["capacity-bytes"] == "67108864"
    assert args["listen"] == "0.0.0.0:50070" and args["metrics-port"] == "9110"
    # Memory: the block pool (allocated at start) plus the overhead, request = limit.
    assert c["resources"]["requests"]["memory"] == c["resources"]["limits"]["memory"] == str(67108864 + 1048576)
    assert c["resources"]["limits"]["cpu"] == "2"
    env = {e["name"]: e for e in c["env"]}
    assert env["KVMESH_API_KEYS"]["valueFrom"]["secretKeyRef"] == {"name": "kvmesh-kv-store-api-key", "key": "api-key"}
    (secret,) = find(docs, "Secret", "kvmesh-kv-store-api-key")
    assert secret["stringData"] == {"api-key": "store-key"}
    # An existing Secret instead: nothing rendered, both sides read it.
    docs = render("cpu", *KV_STORE, "--set", "kvStore.apiKey.existingSecret=mine")
    assert not find(docs, "Secret", "kvmesh-kv-store-api-key")
    (c,) = _pod_spec(docs, "StatefulSet", "kvmesh-kv-store")["containers"]
    assert {e["name"]: e for e in c["env"]}["KVMESH_API_KEYS"]["valueFrom"]["secretKeyRef"]["name"] == "mine"


def test_workers_get_every_store_by_its_stable_dns_name():
    docs = render("cpu", *KV_STORE, "--set", "kvStore.replicas=3")
    stores = ",".join(STORE_DNS.format(i) for i in range(3))
    for name in ("kvmesh-prefill", "kvmesh-decode"):
        (c,) = _pod_spec(docs, "StatefulSet", name)["containers"]
        args = _args(c)
        assert args["kv-store"] == stores, args
        assert args["kv-host-cache-bytes"] == "33554432"
        env = {e["name"]: e for e in c["env"]}
        assert env["KVMESH_KV_STORE_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "kvmesh-kv-store-api-key",
                                                                               "key": "api-key"}
    # The names are those the StatefulSet's pods get behind its headless Service.
    (sts,) = find(docs, "StatefulSet", "kvmesh-kv-store")
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["serviceName"] == "kvmesh-kv-store"


def test_rendered_flags_are_flags_the_binaries_declare():
    """The store's and workers' rendered flags against the ABSL_FLAGs of the sources the
    binaries link (chart_processes_test.py starts them too)."""
    docs = render("cpu", *KV_STORE)
    (store,) = _pod_spec(docs, "StatefulSet", "kvmesh-kv-store")["containers"]
    store_flags = _flags_declared("services/kv_store/main.cc", "libs/kv_store_server/kv_store_flags.cc",
                                  "libs/rpc/tls_flags.cc")
    assert set(_flag_names(store)) <= store_flags, set(_flag_names(store)) - store_flags
    # KVMESH_<FLAG> variables set flag defaults: those the chart sets must name a flag.
    env = {e["name"] for e in store["env"]} - {"KVMESH_TLS_CERT_FILE", "KVMESH_TLS_KEY_FILE", "KVMESH_TLS_CA_FILE"}
    assert {n[len("KVMESH_"):].lower().replace("_", "-") for n in env} <= store_flags, env
    worker_flags = _flags_declared("libs/cli/engine_flags_kv_store.cc", "libs/cli/engine_flags.cc")
    (worker,) = _pod_spec(docs, "StatefulSet", "kvmesh-decode")["containers"]
    assert {"kv-store", "kv-host-cache-bytes"} <= set(_flag_names(worker)) & worker_flags
    assert "kv-store-api-key" in worker_flags
    # The scheduler follows the same stores' events, with the same key.
    scheduler_flags = _flags_declared("services/scheduler/main.cc", "libs/rpc/tls_flags.cc")
    (scheduler,) = _pod_spec(docs, "Deployment", "kvmesh-scheduler")["containers"]
    assert "kv-store" in set(_flag_names(scheduler)) & scheduler_flags
    assert [a for a in scheduler["args"] if a.startswith("--kv-store=")] == \
        [a for a in worker["args"] if a.startswith("--kv-store=")]
    assert "kv-store-api-key" in scheduler_flags


@pytest.mark.parametrize("profile,extra,block_bytes", [
    # Llama-3.1-8B's shape: 32 layers, 8 KV heads, head_dim 128, bf16 KV; TP 1: 2 MiB.
    ("gpu", (), 32 * 2 * 2 * 8 * 16 * 128),
    # TP 2: each rank holds 4 of the 8 KV heads.
    ("gpu-disagg-tp2", (), 32 * 2 * 2 * 4 * 16 * 128),
    # A given size at least the derived one stands (larger slots only waste memory).
    ("gpu", ("--set", "kvStore.blockBytes=4194304"), 4194304),
    # Without a shape the operator's size is taken as given.
    ("gpu", ("--set", "kvStore.blockBytes=3000000", "--set", "model.kvShape.numLayers=0", "--set",
             "model.kvShape.numKeyValueHeads=0", "--set", "model.kvShape.headDim=0", "--set",
             "model.kvShape.kvCacheDtypeBytes=0"), 3000000),
])
def test_kv_store_block_bytes_derived_from_the_model_shape(profile, extra, block_bytes):
    shape = ("--set", "model.path=/models/llama", "--set", "model.kvShape.numLayers=32", "--set",
             "model.kvShape.numKeyValueHeads=8", "--set", "model.kvShape.headDim=128", "--set",
             "model.kvShape.kvCacheDtypeBytes=2")
    hosts = [f"--set=workers.{g}.kvHostCacheBytes=1073741824" for g in ("aggregated", "prefill", "decode")]
    docs = render(profile, "--set", "kvStore.enabled=true", *hosts, *shape, *extra)
    (c,) = _pod_spec(docs, "StatefulSet", "kvmesh-kv-store")["containers"]
    assert _args(c)["block-bytes"] == str(block_bytes)


@pytest.mark.parametrize("values,message", [
    (["workers.decode.kvHostCacheBytes=0"], "kvStore.enabled needs workers.decode.kvHostCacheBytes > 0"),
    (["model.enablePrefixCaching=false"], "kvStore.enabled needs model.enablePrefixCaching"),
    (["model.path=/models/llama"], "does not know the KV shape of model.path=/models/llama"),
    (["model.kvShape.numLayers=4"], "model.kvShape is incomplete"),
    (["kvStore.blockBytes=4096"], "kvStore.blockBytes=4096 is smaller than the workers' blocks (65536 bytes"),
    (["kvStore.capacityBytes=1000"], "kvStore.capacityBytes=1000 holds no block of 65536 bytes"),
    (["kvStore.maxLeaseMs=10"], "kvStore.maxLeaseMs=10 must be at least kvStore.leaseMs=5000"),
    (["kvStore.resources.limits.memory=1Gi"], "kvStore.resources sets memory"),
    (["kvStore.apiKey.enabled=true"], "kvStore.apiKey.enabled needs kvStore.apiKey.key"),
    (["kvStore.apiKey.enabled=true", "kvStore.apiKey.key=a\\,b"], "kvStore.apiKey.key must not contain a comma"),
    (["workers.decode.extraArgs={--kv-cache-dtype=f32}"], "workers.decode.extraArgs sets --kv-cache-dtype=f32"),
    (["workers.decode.extraArgs={--kv-store=elsewhere:1}"], "workers.decode.extraArgs sets --kv-store=elsewhere:1"),
    (["kvStore.extraArgs={--block_bytes=1}"], "kvStore.extraArgs sets --block_bytes=1"),
    (["workers.decode.enabled=false", "workers.prefill.enabled=false"],
     "kvStore.enabled needs at least one enabled worker group"),
])
def test_impossible_kv_store_values_fail_at_template_time(values, message):
    # Valid but for `values` (given last, so they override these).
    base = ["kvStore.enabled=true", "workers.decode.kvHostCacheBytes=1", "workers.prefill.kvHostCacheBytes=1"]
    sets = [a for v in base + values for a in ("--set", v)]
    bad = run_helm("template", "x", CHART, "-f", PROFILES["cpu"], *sets, check=False)
    assert bad.returncode != 0 and message in bad.stderr, bad.stderr


def test_schema_rejects_a_kv_store_without_replicas():
    bad = run_helm("template", "x", CHART, "--set", "kvStore.enabled=true", "--set", "kvStore.replicas=0", check=False)
    assert bad.returncode != 0 and "/kvStore/replicas" in bad.stderr, bad.stderr


def _selects(selector, labels):
    """A NetworkPolicy peer's podSelector (no namespaceSelector: this namespace) against a
    pod's labels."""
    return "namespaceSelector" not in selector and all(
        labels.get(k) == v for k, v in selector.get("podSelector", {}).get("matchLabels", {}).items())


def test_kv_store_network_policy_admits_workers_the_scheduler_and_monitoring_only():
    docs = render("cpu", *KV_STORE)
    (policy,) = find(docs, "NetworkPolicy", "kvmesh-kv-store")
    spec = policy["spec"]
    store_labels = find(docs, "StatefulSet", "kvmesh-kv-store")[0]["spec"]["template"]["metadata"]["labels"]
    assert all(store_labels[k] == v for k, v in spec["podSelector"]["matchLabels"].items())
    assert spec["policyTypes"] == ["Ingress"]
    # No rule without a `from` (that would admit anyone) and no port besides grpc and metrics.
    assert all(r.get("from") for r in spec["ingress"]), spec
    ports = {p["port"] for r in spec["ingress"] for p in r["ports"]}
    assert ports == {"grpc", "metrics"}
    grpc_peers = [f for r in spec["ingress"] if {"port": "grpc", "protocol": "TCP"} in r["ports"] for f in r["from"]]
    metrics_peers = [f for r in spec["ingress"] if {"port": "metrics", "protocol": "TCP"} in r["ports"]
                     for f in r["from"]]
    # Every pod of the release against the gRPC rule: the workers (its data plane) and the
    # scheduler (its events) get in, nothing else does.
    pods = {o["metadata"]["name"]: o["spec"]["template"]["metadata"]["labels"]
            for o in find(docs, "Deployment") + find(docs, "StatefulSet")}
    admitted = {name for name, labels in pods.items() if any(_selects(f, labels) for f in grpc_peers)}
    assert admitted == {"kvmesh-prefill", "kvmesh-decode", "kvmesh-scheduler"}, admitted
    assert not any(_selects(f, labels) for f in metrics_peers for labels in pods.values())
    assert metrics_peers == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert all("namespaceSelector" not in f for f in grpc_peers)
    # Another release's workers carry another instance label: not admitted.
    other = dict(pods["kvmesh-decode"], **{"app.kubernetes.io/instance": "other"})
    assert not any(_selects(f, other) for f in grpc_peers)
    # The store has no UCX (or other) data plane port to open: its container names only these.
    (c,) = _pod_spec(docs, "StatefulSet", "kvmesh-kv-store")["containers"]
    assert {p["name"] for p in c["ports"]} == ports
