"""The router's side of the disaggregated cluster (tools/dev-cluster: kvmesh-scheduler,
a prefill worker, a decode worker and `kvmesh router` on 127.0.0.1), with real
processes: the gRPC kvmesh.v1.Inference API on the router (grpcio, stubs generated
from proto/ at test time) against its REST API; cancellation aborting the request on
the workers; a decode worker that died before the scheduler expired it (the request is
placed again on the other one); the kvmesh-router binary; `promtool check metrics` on
the scheduler's and the router's /metrics."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

import grpc_stubs

grpc = pytest.importorskip("grpc")
protoc = pytest.importorskip("grpc_tools.protoc")

KVMESH = os.environ["KVMESH_BIN"]
SCHEDULER = os.environ["KVMESH_SCHEDULER_BIN"]
ROUTER = os.environ.get("KVMESH_ROUTER_BIN", "")
PROTO_DIR = os.environ.get("KVMESH_PROTO_DIR",
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto"))
DEV_CLUSTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "dev-cluster")
MODEL = "tiny-llama"
RPC_TIMEOUT_S = 120
C = grpc.StatusCode


pb, pb_grpc, common, sched_pb, sched_grpc, health_pb, health_grpc = grpc_stubs.load(
    protoc, PROTO_DIR, ["kvmesh/v1/common.proto", "kvmesh/v1/api.proto", "kvmesh/v1/scheduler.proto"],
    ["kvmesh.v1.api_pb2", "kvmesh.v1.api_pb2_grpc", "kvmesh.v1.common_pb2", "kvmesh.v1.scheduler_pb2",
     "kvmesh.v1.scheduler_pb2_grpc"])


def _get(url, timeout=RPC_TIMEOUT_S):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def _post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=RPC_TIMEOUT_S) as r:
        return r.read().decode()


def _metric(text, name, labels=""):
    for line in text.splitlines():
        if line.startswith(name + labels + " "):
            return float(line.split()[-1])
    return None


class Cluster:
    def __init__(self):
        self.run_dir = tempfile.mkdtemp(prefix="kvmesh-router-cluster-")
        self.env = dict(os.environ, KVMESH_BIN=KVMESH, KVMESH_SCHEDULER_BIN=SCHEDULER)
        out = subprocess.run([sys.executable, DEV_CLUSTER, "start", "--run-dir", self.run_dir, "--heartbeat-ms", "100"],
                             capture_output=True, text=True, env=self.env, timeout=300)
        assert out.returncode == 0, out.stderr + self.logs()
        self.state = json.loads(out.stdout)
        p = self.state["processes"]
        self.url = p["router"]["url"]
        self.scheduler = p["scheduler"]["address"]
        self.scheduler_metrics_url = p["scheduler"]["metrics_url"]
        self.channel = grpc.insecure_channel(p["router"]["grpc_address"])
        self.stub = pb_grpc.InferenceStub(self.channel)
        self.extra = []  # (name, Popen) of workers started by tests

    def logs(self):
        text = ""
        for name in ("scheduler", "prefill", "decode", "router", "extra-decode", "kvmesh-router"):
            path = os.path.join(self.run_dir, f"{name}.log")
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    text += f"\n--- {name}.log ---\n" + f.read()[-4000:]
        return text

    def workers(self):
        with grpc.insecure_channel(self.scheduler) as channel:
            return {w.worker_id: w for w in sched_grpc.SchedulerStub(channel).ListWorkers(
                sched_pb.ListWorkersRequest(), timeout=10).workers}

    def rest(self, path, body=None):
        text = _get(self.url + path) if body is None else _post(self.url + path, body)
        return text if path == "/metrics" else json.loads(text)

    def stop(self):
        self.channel.close()
        for _, proc in self.extra:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return subprocess.run([sys.executable, DEV_CLUSTER, "stop", "--run-dir", self.run_dir],
                              capture_output=True, text=True, env=self.env, timeout=120)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    yield c
    out = c.stop()
    assert out.returncode == 0, out.stderr


def greedy(max_tokens, **kw):
    return common.SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, skip_special_tokens=True, **kw)


def generate(cluster, timeout=RPC_TIMEOUT_S, **kw):
    return list(cluster.stub.Generate(pb.GenerateRequest(**kw), timeout=timeout))


def _sse_text(cluster, body):
    req = urllib.request.Request(cluster.url + "/v1/completions", data=json.dumps(dict(body, stream=True)).encode(),
                                 headers={"Content-Type": "application/json"})
    text = ""
    with urllib.request.urlopen(req, timeout=RPC_TIMEOUT_S) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[len("data: "):])
                text += "".join(c["text"] for c in chunk["choices"])
    return text


# ---- the gRPC API on the router ----

@pytest.mark.parametrize("prompt", ["Paged attention stores keys and values", "Once upon a time, in a land far away"])
def test_grpc_generate_equals_rest_greedy_streaming_and_not(cluster, prompt):
    rs = generate(cluster, model=MODEL, text=prompt, sampling=greedy(20),
                  stream_options=pb.StreamOptions(include_usage=True))
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 20, "temperature": 0, "ignore_eos": True}
    rest = cluster.rest("/v1/completions", body)
    assert len(rs) >= 2, "expected a stream of messages"
    assert sum(len(r.token_ids) for r in rs) == 20
    assert [r.finish_reason for r in rs if r.finish_reason] == [common.FINISH_REASON_LENGTH]
    assert "".join(r.text for r in rs) == rest["choices"][0]["text"]
    assert _sse_text(cluster, body) == rest["choices"][0]["text"]
    assert rs[-1].usage.completion_tokens == 20
    assert rs[-1].usage.prompt_tokens == rest["usage"]["prompt_tokens"]


def test_grpc_token_ids_and_chat_prompts(cluster):
    prompt = "Paged attention stores keys and values"
    ids = list(cluster.stub.Tokenize(pb.TokenizeRequest(text=prompt), timeout=30).token_ids)
    by_ids = generate(cluster, token_ids=pb.TokenIds(ids=ids), sampling=greedy(12))
    by_text = generate(cluster, text=prompt, sampling=greedy(12))
    assert [t for r in by_ids for t in r.token_ids] == [t for r in by_text for t in r.token_ids]
    messages = [{"role": "user", "content": "Say something about foxes."}]
    chat = pb.ChatPrompt(messages=[pb.ChatMessage(**m) for m in messages])
    rs = generate(cluster, chat=chat, sampling=greedy(10))
    rest = cluster.rest("/v1/chat/completions", {"messages": messages, "max_tokens": 10, "temperature": 0,
                                                  "ignore_eos": True})
    assert "".join(r.text for r in rs) == rest["choices"][0]["message"]["content"]


def test_grpc_tokenize_list_models_and_health(cluster):
    r = cluster.stub.Tokenize(pb.TokenizeRequest(text="Hello, world!", return_token_strings=True), timeout=30)
    cli = subprocess.run([KVMESH, "tokenize", "--text", "Hello, world!"], capture_output=True, text=True, check=True)
    assert list(r.token_ids) == json.loads(cli.stdout)
    assert r.count == len(r.token_ids) == len(r.token_strings) and r.max_model_len > 0
    models = cluster.stub.ListModels(pb.ListModelsRequest(), timeout=30)
    assert [m.id for m in models.models] == [MODEL]
    assert [m["id"] for m in cluster.rest("/v1/models")["data"]] == [MODEL]
    health = health_grpc.HealthStub(cluster.channel)
    for service in ("", "kvmesh.v1.Inference"):
        assert health.Check(health_pb.HealthCheckRequest(service=service), timeout=10).status == \
            health_pb.HealthCheckResponse.SERVING


BAD_GENERATE = [
    (dict(sampling=greedy(4)), C.INVALID_ARGUMENT, "prompt"),
    (dict(text="", sampling=greedy(4)), C.INVALID_ARGUMENT, "text"),
    (dict(token_ids=pb.TokenIds(ids=[1, 10 ** 7]), sampling=greedy(4)), C.INVALID_ARGUMENT, "token_ids.ids[1]"),
    (dict(text="x", sampling=common.SamplingParams(temperature=-1)), C.INVALID_ARGUMENT, "sampling.temperature"),
    (dict(text="x", sampling=common.SamplingParams(max_tokens=10 ** 9)), C.INVALID_ARGUMENT, "sampling.max_tokens"),
    (dict(text="x", sampling=common.SamplingParams(n=100000)), C.INVALID_ARGUMENT, "sampling.n"),
    (dict(text="word " * 9000, sampling=greedy(4)), C.INVALID_ARGUMENT, "text"),
    (dict(model="nope", text="x", sampling=greedy(4)), C.NOT_FOUND, "nope"),
]


@pytest.mark.parametrize("fields,code,word", BAD_GENERATE)
def test_grpc_bad_input_gets_the_right_status(cluster, fields, code, word):
    with pytest.raises(grpc.RpcError) as e:
        generate(cluster, timeout=30, **fields)
    assert e.value.code() == code, e.value.details()
    assert word in e.value.details(), e.value.details()


def _wait_decode_idle(cluster, worker_id="dev-decode", timeout_s=30):
    deadline = time.time() + timeout_s
    load = None
    while time.time() < deadline:
        w = cluster.workers().get(worker_id)
        load = w.load if w is not None else None
        if load is not None and load.kv_blocks_used == 0 and load.num_running_seqs == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"{worker_id} still busy: {load}{cluster.logs()}")


def test_grpc_cancel_aborts_the_request_on_the_workers(cluster):
    call = cluster.stub.Generate(pb.GenerateRequest(text="Tell me a long story", sampling=greedy(4000)),
                                 timeout=RPC_TIMEOUT_S)
    got = 0
    for r in call:
        got += len(r.token_ids)
        if got >= 5:
            break
    # The decode worker reports the running sequence in its heartbeats (every 100 ms).
    deadline = time.time() + 10
    while time.time() < deadline and cluster.workers()["dev-decode"].load.num_running_seqs == 0:
        time.sleep(0.05)
    assert cluster.workers()["dev-decode"].load.kv_blocks_used > 0
    call.cancel()
    _wait_decode_idle(cluster)
    assert _metric(cluster.rest("/metrics"), "kvmesh_router_requests_inflight") == 0
    # Still serving.
    assert sum(len(r.token_ids) for r in generate(cluster, text="still alive", sampling=greedy(3))) == 3


# ---- retry on another decode worker ----

def _start_decode_worker(cluster, worker_id):
    log = open(os.path.join(cluster.run_dir, "extra-decode.log"), "w")
    proc = subprocess.Popen([KVMESH, "worker", "--role=decode", "--listen=127.0.0.1:0",
                             f"--scheduler={cluster.scheduler}", f"--worker_id={worker_id}",
                             f"--kv-cache-bytes={64 << 20}", "--threads=1"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    cluster.extra.append((worker_id, proc))
    deadline = time.time() + 120
    while time.time() < deadline and worker_id not in cluster.workers():
        assert proc.poll() is None, cluster.logs()
        time.sleep(0.1)
    assert worker_id in cluster.workers(), cluster.logs()
    return proc


def test_a_dead_decode_worker_is_retried_elsewhere_before_the_first_token(cluster):
    # "dev-a-decode" sorts before "dev-decode": with equal scores placement picks it.
    proc = _start_decode_worker(cluster, "dev-a-decode")
    before = _metric(cluster.rest("/metrics"), "kvmesh_router_retries_total") or 0
    proc.send_signal(signal.SIGKILL)  # dies without deregistering; its lease runs on
    proc.wait()
    assert "dev-a-decode" in cluster.workers()
    texts = []
    for i in range(3):  # fresh prompts: no cached prefix tilts the placement
        body = {"model": MODEL, "prompt": f"A fresh prompt, number {i}, about retries", "max_tokens": 8,
                "temperature": 0}
        texts.append(cluster.rest("/v1/completions", body)["choices"][0]["text"])
        rs = generate(cluster, text=f"Another fresh prompt, number {i}", sampling=greedy(8))
        assert sum(len(r.token_ids) for r in rs) == 8
    assert all(texts)
    metrics = cluster.rest("/metrics")
    retries = _metric(metrics, "kvmesh_router_retries_total") - before
    assert retries >= 1, cluster.logs()
    assert _metric(metrics, "kvmesh_router_upstream_errors_total", '{stage="generate",code="UNAVAILABLE"}') >= retries
    # The scheduler drops it once its lease ends (the default TTL, 5 s).
    deadline = time.time() + 30
    while time.time() < deadline and "dev-a-decode" in cluster.workers():
        time.sleep(0.2)
    assert "dev-a-decode" not in cluster.workers()
    scheduler_metrics = _get(cluster.scheduler_metrics_url + "/metrics")
    assert _metric(scheduler_metrics, "kvmesh_scheduler_worker_expirations") >= 1


# ---- the kvmesh-router binary ----

def test_kvmesh_router_binary_serves_the_same_apis_and_drains_on_sigterm(cluster):
    if not ROUTER:
        pytest.skip("KVMESH_ROUTER_BIN not set")
    log_path = os.path.join(cluster.run_dir, "kvmesh-router.log")
    with open(log_path, "w") as log:
        # A generous drain deadline: ctest may run other servers beside this cluster, and a
        # drain that outlives its deadline aborts the stream (another behaviour).
        proc = subprocess.Popen([ROUTER, f"--scheduler={cluster.scheduler}", "--host=127.0.0.1", "--port=0",
                                 "--grpc-port=0", "--drain-timeout-ms=240000"], stdout=log, stderr=subprocess.STDOUT)
    try:
        url = grpc_address = None
        deadline = time.time() + 60
        while time.time() < deadline and not (url and grpc_address):
            with open(log_path) as f:
                text = f.read()
            for line in text.splitlines():
                if "router listening on http://" in line:
                    url = line.split("router listening on ")[1].split()[0]
                if "router grpc listening on " in line:
                    grpc_address = line.split("router grpc listening on ")[1].split()[0]
            assert proc.poll() is None, text
            time.sleep(0.1)
        assert url and grpc_address, cluster.logs()
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        want = cluster.rest("/v1/completions", body)["choices"][0]["text"]
        assert json.loads(_post(url + "/v1/completions", body))["choices"][0]["text"] == want
        with grpc.insecure_channel(grpc_address) as channel:
            rs = list(pb_grpc.InferenceStub(channel).Generate(
                pb.GenerateRequest(text="Once upon a time", sampling=greedy(12)), timeout=RPC_TIMEOUT_S))
        assert "".join(r.text for r in rs) == want
        help_text = subprocess.run([ROUTER, "--help"], capture_output=True, text=True, timeout=30).stdout
        assert "--scheduler" in help_text and "KVMESH_GRPC_PORT" in help_text

        # SIGTERM drains: health NOT_SERVING, new calls UNAVAILABLE, the running stream finishes.
        with grpc.insecure_channel(grpc_address) as channel:
            stub = pb_grpc.InferenceStub(channel)
            running = stub.Generate(pb.GenerateRequest(text="A long story", sampling=greedy(1000)), timeout=300)
            first = next(running)
            proc.send_signal(signal.SIGTERM)
            health = health_grpc.HealthStub(channel)
            deadline = time.time() + 30
            while time.time() < deadline and health.Check(health_pb.HealthCheckRequest(), timeout=10).status == \
                    health_pb.HealthCheckResponse.SERVING:
                time.sleep(0.02)
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.Generate(pb.GenerateRequest(text="late", sampling=greedy(2)), timeout=30))
            assert refused.value.code() == C.UNAVAILABLE, refused.value.details()
            rest = list(running)
            assert sum(len(r.token_ids) for r in [first, *rest]) == 1000
            assert rest[-1].finish_reason == common.FINISH_REASON_LENGTH
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


# ---- metrics ----

def _promtool(text):
    out = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_accepts_the_scheduler_and_router_metrics(cluster):
    import shutil
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    scheduler = _get(cluster.scheduler_metrics_url + "/metrics")
    router = cluster.rest("/metrics")
    _promtool(scheduler)
    _promtool(router)
    # The families this test file exercised are there, with samples.
    assert _metric(scheduler, "kvmesh_scheduler_workers", '{role="decode"}') >= 1
    assert _metric(scheduler, "kvmesh_scheduler_workers", '{role="prefill"}') == 1
    assert _metric(scheduler, "kvmesh_scheduler_place_requests_total", '{code="OK"}') > 0
    assert _metric(scheduler, "kvmesh_scheduler_place_latency_seconds_count") > 0
    assert _metric(scheduler, "kvmesh_scheduler_heartbeats_total", '{code="OK"}') > 0
    assert _metric(scheduler, "kvmesh_scheduler_prefix_index_blocks") > 0
    assert _metric(router, "kvmesh_time_to_first_token_seconds_count") > 0
    assert _metric(router, "kvmesh_router_retries_total") is not None


@pytest.mark.parametrize("binary, args, message", [
    ("scheduler", ["--listen", "127.0.0.1:99999"], "--listen: address \"127.0.0.1:99999\": port 99999 is out of range"),
    ("scheduler", ["--overload-kv-usage", "2"], "--overload_kv_usage=2 is out of range [0, 1]"),
    ("router", ["--scheduler", "127.0.0.1:1", "--port", "80000"], "--port=80000 is out of range [0, 65535]"),
])
def test_service_binaries_refuse_out_of_range_flags(binary, args, message):
    # kvmesh-scheduler --listen 127.0.0.1:99999 used to listen on 34463.
    path = SCHEDULER if binary == "scheduler" else ROUTER
    if not path:
        pytest.skip("kvmesh-router not built")
    proc = subprocess.run([path, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
