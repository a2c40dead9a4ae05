"""The chart is real, not only valid: values-cpu.yaml rendered, the image layout staged by
deploy/docker/build-in-image.sh (the script both Dockerfiles run), and every rendered
container's command line started with its env and args as a process on 127.0.0.1 (ports
remapped, see kubelet.py). A completion goes through the router over the rendered flags,
and every probe answers as the kubelet would call it: a worker's startupProbe fails while
it loads and until it has registered, readiness fails while a component drains, liveness
holds through the drain, and the drain finishes the running request within
terminationGracePeriodSeconds. With kvStore.enabled, the rendered kv-store pods start from
their own rendered flags, pass their probes, and the rendered workers reach them by their
stable DNS names with the rendered API key: blocks the workers compute are put there."""
import json
import os
import re
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest

from deploy_common import KV_STORE, NAMESPACE, ROOT, find, render
from kubelet import Cluster, probe

BUILD = os.environ.get("KVMESH_BUILD_DIR", os.path.join(ROOT, "build"))


@pytest.fixture(scope="module")
def image_root():
    with tempfile.TemporaryDirectory(prefix="kvmesh-image-") as d:
        prefix = os.path.join(d, "opt-kvmesh")
        result = subprocess.run([os.path.join(ROOT, "deploy/docker/build-in-image.sh"), "--skip-setup", "--skip-build",
                                 "--prefix", prefix], env={**os.environ, "BUILD_DIR": BUILD},
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout + result.stderr
        yield prefix


def test_staged_image_layout_and_runtime_packages(image_root):
    for b in ("kvmesh", "kvmesh-scheduler", "kvmesh-router", "kvmesh-prefill-worker", "kvmesh-decode-worker",
              "kvmesh-kv-store"):
        assert os.access(os.path.join(image_root, "bin", b), os.X_OK), b
    assert os.path.exists(os.path.join(image_root, "models/tiny-llama/config.json"))
    with open(os.path.join(image_root, "share/runtime-packages.txt")) as f:
        packages = f.read().split()
    # The runtime stage installs these: each must be a real, installed Debian package, and
    # together they must cover what the binaries load (gRPC, Abseil, protobuf at least).
    assert packages, "no runtime packages"
    for p in packages:
        status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True).stdout
        assert "install ok installed" in status, p
    assert any(p.startswith("libgrpc++") for p in packages), packages
    assert any(p.startswith("libprotobuf") for p in packages), packages
    assert not any(p.endswith("-dev") for p in packages), "a -dev package in the runtime stage"


def _wait(predicate, timeout_s, what, pods=()):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        v = predicate()
        if v:
            return v
        time.sleep(0.1)
    logs = "\n".join(f"--- {p.name}\n{p.log()[-3000:]}" for p in pods)
    pytest.fail(f"timed out waiting for {what}\n{logs}")


def _startup_budget_s(pod):
    p = pod.container["startupProbe"]
    return p.get("periodSeconds", 10) * p.get("failureThreshold", 3)


def _kubelet_startup(pod):
    """Polls the startupProbe until it passes, within its failureThreshold x periodSeconds."""
    last = [None]

    def ok():
        assert pod.proc.poll() is None, f"{pod.name} exited:\n{pod.log()}"
        passed, last[0] = probe(pod, "startupProbe")
        return passed
    _wait(ok, _startup_budget_s(pod), f"{pod.name}'s startupProbe (last: {last[0]})", [pod])


def _args(pod):
    c = pod.container
    return dict(a[2:].split("=", 1) for a in c.get("args", []) if a.startswith("--") and "=" in a)


def _post(url, body, timeout=120):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:  # the caller's assertion shows the error body
        return e.code, e.read().decode()


def _metric(pod, name, labels=""):
    url = f"http://127.0.0.1:{pod.local_port('metrics')}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and labels in line and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_rendered_cpu_chart_serves_and_probes_like_the_kubelet(image_root):
    docs = render("cpu")
    (configmap,) = find(docs, "ConfigMap", "kvmesh-model")
    model = configmap["data"]["KVMESH_SERVED_MODEL_NAME"]
    with tempfile.TemporaryDirectory(prefix="kvmesh-chart-run-") as run_dir:
        cluster = Cluster(docs, NAMESPACE, image_root, run_dir)
        assert set(cluster.pods) == {"kvmesh-router-7c9f8d-0", "kvmesh-scheduler-7c9f8d-0", "kvmesh-prefill-0",
                                     "kvmesh-decode-0"}
        router = cluster.pods["kvmesh-router-7c9f8d-0"]
        scheduler = cluster.pods["kvmesh-scheduler-7c9f8d-0"]
        prefill, decode = cluster.pods["kvmesh-prefill-0"], cluster.pods["kvmesh-decode-0"]
        try:
            # Workers first, before the scheduler exists: their startupProbe must fail while
            # the model loads (the port is not open yet) and after, until they register.
            for w in (prefill, decode):
                cluster.start(w.name)
                ok, detail = probe(w, "startupProbe")
                assert not ok, f"{w.name} started before loading: {detail}"
            for w in (prefill, decode):
                assert "svc.cluster.local" not in " ".join(w.argv) and "0.0.0.0" not in " ".join(w.argv), w.argv
                _wait(lambda w=w: "worker metrics on" in w.log(), 120, f"{w.name} to load its model", [w])
                ok, detail = probe(w, "startupProbe")
                assert not ok and detail.startswith("503") and "registering" in detail, detail
                ok, detail = probe(w, "readinessProbe")
                assert not ok, detail
                ok, detail = probe(w, "livenessProbe")  # alive, just not started
                assert ok, detail
                assert "registered with the scheduler" not in w.log()

            cluster.start(scheduler.name)
            _kubelet_startup(scheduler)
            for w in (prefill, decode):
                _kubelet_startup(w)
                assert "registered with the scheduler" in w.log()
                # The stable id: the StatefulSet pod's name, advertised at its pod DNS name.
                assert f"worker_id={w.name}" in w.log(), w.log()
            cluster.start(router.name)
            _kubelet_startup(router)
            for pod in cluster.pods.values():
                for kind in ("readinessProbe", "livenessProbe"):
                    ok, detail = probe(pod, kind)
                    assert ok, (pod.name, kind, detail)

            # A completion through the router, over the rendered flags.
            url = f"http://127.0.0.1:{router.local_port('http')}"
            status, body = _post(url + "/v1/completions", {"model": model, "prompt": "Once upon a time",
                                                           "max_tokens": 8, "temperature": 0, "ignore_eos": True})
            reply = json.loads(body)
            assert status == 200 and reply["usage"]["completion_tokens"] == 8, body
            # A long prompt is prefilled on the prefill worker and its KV pushed to decode.
            # NOTE: a remote prefill that fails or stalls is served by the decode worker
            # itself (the local-prefill fallback, kvmesh_kv_remote_prefill_fallbacks), which
            # a loaded CI machine has hit once: up to three fresh prompts, one must move KV.
            for attempt in range(3):
                long_prompt = " ".join(f"word{i}-{attempt}" for i in range(400))
                status, body = _post(url + "/v1/completions", {"model": model, "prompt": long_prompt,
                                                               "max_tokens": 4, "temperature": 0, "ignore_eos": True})
                assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 4, body
                if _metric(decode, "kvmesh_kv_transfer_bytes_total", 'direction="received"') > 0:
                    break
                print(f"attempt {attempt}: no KV moved (fallbacks so far: "
                      f"{_metric(decode, 'kvmesh_kv_remote_prefill_fallbacks')})", flush=True)
            logs = "\n".join(f"--- {p.name}\n{p.log()[-3000:]}" for p in (decode, prefill))
            assert _metric(decode, "kvmesh_kv_transfer_bytes_total", 'direction="received"') > 0, logs
            assert _metric(prefill, "kvmesh_kv_transfer_bytes_total", 'direction="sent"') > 0, logs

            # Drain: a long stream runs; the kubelet deletes the router and the decode pod
            # (preStop, then SIGTERM). Readiness fails at once, liveness holds, the stream
            # finishes in full, both exit 0 within terminationGracePeriodSeconds.
            # Sized from the measured speed so that the stream outlives the preStop sleep and
            # the probes by a few seconds, yet ends well within the drain timeout.
            sleep_s = router.container["lifecycle"]["preStop"]["sleep"]["seconds"]
            drain_s = int(_args(router)["drain-timeout-ms"]) / 1000
            t0 = time.time()
            _post(url + "/v1/completions", {"model": model, "prompt": "Warm up", "max_tokens": 64, "temperature": 0,
                                            "ignore_eos": True})
            tokens_per_s = 64 / max(time.time() - t0, 1e-3)
            max_tokens = int(min(max(tokens_per_s * (sleep_s + 4), 64), tokens_per_s * drain_s / 2, 4000))
            stream = {"tokens": 0, "finish": None, "error": None}
            started = threading.Event()

            def run_stream():
                try:
                    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(
                        {"model": model, "prompt": "A long story", "max_tokens": max_tokens, "temperature": 0,
                         "ignore_eos": True, "stream": True}).encode(), headers={"Content-Type": "application/json"})
                    with urllib.request.urlopen(req, timeout=300) as r:
                        for line in r:
                            line = line.decode().strip()
                            if not line.startswith("data: ") or line == "data: [DONE]":
                                continue
                            choice = json.loads(line[6:])["choices"][0]
                            if choice.get("text"):
                                stream["tokens"] += 1
                                started.set()
                            if choice.get("finish_reason"):
                                stream["finish"] = choice["finish_reason"]
                except Exception as e:  # reported by the assertions below
                    stream["error"] = repr(e)
                finally:
                    started.set()

            t = threading.Thread(target=run_stream, daemon=True)
            t.start()
            assert started.wait(120) and stream["error"] is None, stream
            time.sleep(sleep_s)  # the preStop hook
            for pod in (router, decode):
                cluster.terminate(pod.name)
            for pod in (router, decode):
                # The signal is handled asynchronously: the kubelet sees the failure by its next
                # probe (one periodSeconds x failureThreshold later at most).
                spec = pod.container["readinessProbe"]
                budget_s = spec.get("periodSeconds", 10) * spec.get("failureThreshold", 3)
                answer = {}

                def not_ready(pod=pod, answer=answer):
                    answer["ok"], answer["detail"] = probe(pod, "readinessProbe")
                    return not answer["ok"]
                _wait(not_ready, budget_s, f"{pod.name}'s readiness to fail while draining", [pod])
                detail = answer["detail"]
                assert detail.startswith("503") and "draining" in detail, (pod.name, detail)
                ok, detail = probe(pod, "livenessProbe")
                assert ok, (pod.name, detail)
            # All of that while the request was still running (else nothing was drained).
            assert stream["finish"] is None, f"the stream ended before the probes ({max_tokens} tokens)"
            grace_s = router.spec["terminationGracePeriodSeconds"] - sleep_s
            t.join(grace_s + 60)
            assert stream["error"] is None and stream["finish"] == "length", stream
            for pod in (router, decode):
                assert pod.proc.wait(timeout=grace_s) == 0, pod.log()[-3000:]
        finally:
            cluster.stop_all()


def test_rendered_kv_store_serves_the_rendered_workers(image_root):
    docs = render("cpu", *KV_STORE)
    (configmap,) = find(docs, "ConfigMap", "kvmesh-model")
    model = configmap["data"]["KVMESH_SERVED_MODEL_NAME"]
    with tempfile.TemporaryDirectory(prefix="kvmesh-chart-kv-store-") as run_dir:
        cluster = Cluster(docs, NAMESPACE, image_root, run_dir)
        stores = [cluster.pods["kvmesh-kv-store-0"], cluster.pods["kvmesh-kv-store-1"]]
        scheduler = cluster.pods["kvmesh-scheduler-7c9f8d-0"]
        prefill, decode = cluster.pods["kvmesh-prefill-0"], cluster.pods["kvmesh-decode-0"]
        router = cluster.pods["kvmesh-router-7c9f8d-0"]
        block_bytes = int(_args(stores[0])["block-bytes"])
        # The shape the chart assumes for the image's tiny model is the model's: one block,
        # every layer, K and V, in the KV dtype --kv-cache-dtype=auto picks (bf16 for bf16
        # weights, else f32).
        with open(os.path.join(image_root, "models/tiny-llama/config.json")) as f:
            config = json.load(f)
        dtype_bytes = 2 if config["torch_dtype"] == "bfloat16" else 4
        block_tokens = int(configmap["data"]["KVMESH_BLOCK_SIZE"])
        assert block_bytes == (config["num_hidden_layers"] * 2 * dtype_bytes * config["num_key_value_heads"] *
                               block_tokens * config["head_dim"]), config
        try:
            # The stores first: the rendered flags are accepted (a refused one exits 2), the
            # block memory is allocated, then gRPC health answers SERVING.
            for store in stores:
                cluster.start(store.name)
            for store in stores:
                _kubelet_startup(store)
                for kind in ("readinessProbe", "livenessProbe"):
                    ok, detail = probe(store, kind)
                    assert ok, (store.name, kind, detail)
                assert f"slot_bytes={block_bytes}" in store.log(), store.log()
                assert "api_keys=1" in store.log(), store.log()
                assert _metric(store, "kvmesh_kv_store_slot_bytes") == block_bytes
            for pod in (scheduler, prefill, decode):
                cluster.start(pod.name)
            for pod in (scheduler, prefill, decode):
                _kubelet_startup(pod)
            # Both stores, at the addresses the chart rendered (DNS names resolved here).
            for w in (prefill, decode):
                assert all(f"127.0.0.1:{s.local_port('grpc')}" in " ".join(w.argv) for s in stores), w.argv
            cluster.start(router.name)
            _kubelet_startup(router)

            # Prompts with shared prefixes, short (decode computes them) and long (prefill
            # does): full blocks are written through to their home stores soon after.
            url = f"http://127.0.0.1:{router.local_port('http')}"
            shared = " ".join(f"shared{i}" for i in range(120))
            for prompt in (shared + " short", shared + " " + " ".join(f"long{i}" for i in range(300))):
                status, body = _post(url + "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 4,
                                                               "temperature": 0, "ignore_eos": True})
                assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 4, body

            def puts():
                return sum(_metric(s, "kvmesh_kv_store_put_blocks") for s in stores)
            logs = [prefill, decode, *stores]
            _wait(lambda: puts() > 0, 60, "blocks put into the kv-stores", logs)
            for store in stores:
                # The rendered key matches (no refused peer) and the blocks fit the slots.
                for code in ("UNAUTHENTICATED", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"):
                    assert _metric(store, "kvmesh_kv_store_requests_total", f'code="{code}"') == 0, (store.name, code)

            # Both workers restart (empty device and host caches); the prompt again: its
            # prefix comes back from the stores instead of being recomputed.
            for w in (prefill, decode):
                cluster.terminate(w.name)
            for w in (prefill, decode):
                assert w.proc.wait(timeout=w.spec["terminationGracePeriodSeconds"]) == 0, w.log()[-3000:]
                cluster.start(w.name)
            for w in (prefill, decode):
                _kubelet_startup(w)

            def gets():
                return sum(_metric(s, "kvmesh_kv_store_get_blocks") for s in stores)
            status, body = _post(url + "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 4,
                                                           "temperature": 0, "ignore_eos": True})
            assert status == 200, body
            _wait(lambda: gets() > 0, 30, "blocks read back from the kv-stores", logs)
            print(f"put {puts():.0f} blocks, got {gets():.0f}", flush=True)

            # A store drains like the scheduler: readiness (gRPC health) fails, then it exits 0
            # within the grace period.
            store = stores[1]
            cluster.terminate(store.name)
            answer = {}

            def not_ready():
                answer["ok"], answer["detail"] = probe(store, "readinessProbe")
                return not answer["ok"]
            spec = store.container["readinessProbe"]
            _wait(not_ready, spec["periodSeconds"] * spec["failureThreshold"] + 5, "the store's readiness to fail",
                  [store])
            grace_s = store.spec["terminationGracePeriodSeconds"]
            assert store.proc.wait(timeout=grace_s) == 0, store.log()[-3000:]
        finally:
            cluster.stop_all()
