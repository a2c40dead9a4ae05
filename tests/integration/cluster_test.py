"""The disaggregated cluster end to end: kvmesh-scheduler, a prefill worker, a decode
worker and the router on 127.0.0.1 (started by tools/dev-cluster), driven by the
`openai` client and compared with `kvmesh serve` (aggregated) on the same model:
greedy text must be identical, also for a repeated prompt (whose prefix is then cached
on the workers); a prefill worker killed mid-request makes the decode worker prefill
that request itself (tokens, not an error) and leaves no KV block in use on it; both workers' /metrics pass
`promtool check metrics`, and a client that leaves mid-stream (or mid-prefill) leaves
no KV block in use on either worker."""

import http.client
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pytest

openai = pytest.importorskip("openai")

KVMESH = os.environ["KVMESH_BIN"]
SCHEDULER = os.environ["KVMESH_SCHEDULER_BIN"]
PROTO_DIR = os.environ.get("KVMESH_PROTO_DIR",
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto"))
DEV_CLUSTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "dev-cluster")
MODEL = "tiny-llama"

PROMPTS = [
    "The quick brown fox jumps over the lazy dog and then",
    "Once upon a time, in a land far away, there lived a king who had three daughters. The eldest",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24,",
    # Repeated: the second time its full blocks are cached on both workers.
    "The quick brown fox jumps over the lazy dog and then",
    "Once upon a time, in a land far away, there lived a king who had three daughters. The youngest",
]


_STUBS = []


def _scheduler_stubs():
    """ListWorkers over grpcio (stubs generated at test time, once), or None without grpcio."""
    if _STUBS:
        return _STUBS[0]
    _STUBS.append(_make_stubs())
    return _STUBS[0]


def _make_stubs():
    try:
        grpc = importlib.import_module("grpc")
        protoc = importlib.import_module("grpc_tools.protoc")
    except ImportError:
        return None
    out = tempfile.mkdtemp(prefix="kvmesh-cluster-stubs-")
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    rc = protoc.main(["grpc_tools.protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={out}",
                      f"--grpc_python_out={out}", "kvmesh/v1/common.proto", "kvmesh/v1/scheduler.proto",
                      "kvmesh/v1/worker.proto"])
    assert rc == 0
    sys.path.insert(0, out)
    pb = importlib.import_module("kvmesh.v1.scheduler_pb2")
    pb_grpc = importlib.import_module("kvmesh.v1.scheduler_pb2_grpc")
    return grpc, pb, pb_grpc


class Serve:
    """`kvmesh serve` (aggregated) on an ephemeral port: the reference."""

    def __init__(self):
        extra = []
        help_text = subprocess.run([KVMESH, "serve", "--help"], capture_output=True, text=True).stdout
        if "grpc_port" in help_text or "grpc-port" in help_text:
            extra.append("--grpc_port=-1")
        self.proc = subprocess.Popen(
            [KVMESH, "serve", "--host", "127.0.0.1", "--port", "0", "--kv-cache-bytes", str(256 << 20), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.port = None
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        assert self.port, "kvmesh serve did not start"
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=60) == 0


class Cluster:
    def __init__(self):
        self.run_dir = tempfile.mkdtemp(prefix="kvmesh-cluster-")
        env = dict(os.environ, KVMESH_BIN=KVMESH, KVMESH_SCHEDULER_BIN=SCHEDULER)
        self.env = env
        out = subprocess.run([sys.executable, DEV_CLUSTER, "start", "--run-dir", self.run_dir, "--heartbeat-ms", "100"],
                             capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr + self.logs()
        self.state = json.loads(out.stdout)
        self.url = self.state["processes"]["router"]["url"]

    def pid(self, name):
        return self.state["processes"][name]["pid"]

    def logs(self):
        text = ""
        for name in ("scheduler", "prefill", "decode", "router"):
            path = os.path.join(self.run_dir, f"{name}.log")
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    text += f"\n--- {name}.log ---\n" + f.read()[-4000:]
        return text

    def stop(self):
        out = subprocess.run([sys.executable, DEV_CLUSTER, "stop", "--run-dir", self.run_dir],
                             capture_output=True, text=True, env=self.env, timeout=120)
        return out


@pytest.fixture(scope="module")
def serve():
    s = Serve()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    yield c
    c.stop()


def _client(url):
    return openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=120)


def _complete(client, prompt):
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
    return r.choices[0].text, r.choices[0].finish_reason


def test_router_text_equals_kvmesh_serve(serve, cluster):
    ref = _client(f"http://127.0.0.1:{serve.port}")
    routed = _client(cluster.url)
    for prompt in PROMPTS:
        want = _complete(ref, prompt)
        got = _complete(routed, prompt)
        assert got == want, f"prompt {prompt!r}\n{cluster.logs()}"
    # Streaming and chat go through the same token source.
    stream = routed.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=24, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == _complete(ref, PROMPTS[1])[0]
    messages = [{"role": "user", "content": "Say something about foxes."}]
    want = ref.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    got = routed.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    assert got.choices[0].message.content == want.choices[0].message.content
    # The prompts really were prefilled on the prefill worker: it reported their blocks.
    stubs = _scheduler_stubs()
    if stubs is not None:
        assert _worker_status(stubs, cluster, "dev-prefill").num_indexed_blocks > 0, cluster.logs()


def _worker_status(stubs, cluster, worker_id):
    grpc, pb, pb_grpc = stubs
    with grpc.insecure_channel(cluster.state["processes"]["scheduler"]["address"]) as channel:
        workers = pb_grpc.SchedulerStub(channel).ListWorkers(pb.ListWorkersRequest(), timeout=10).workers
    for w in workers:
        if w.worker_id == worker_id:
            return w
    return None


def _decode_load(stubs, cluster):
    status = _worker_status(stubs, cluster, "dev-decode")
    return status.load if status is not None else None


def _worker_metrics(cluster, role):
    with urllib.request.urlopen(cluster.state["processes"][role]["metrics_url"] + "/metrics", timeout=10) as r:
        assert r.status == 200
        return r.read().decode()


def _metric(text, name, labels=""):
    m = re.search(r"^" + re.escape(name + labels) + r" (\S+)$", text, re.M)
    assert m, f"{name}{labels} not in\n{text}"
    return float(m.group(1))


def test_promtool_accepts_both_workers_metrics(cluster):
    for role in ("prefill", "decode"):
        text = _worker_metrics(cluster, role)
        out = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert out.returncode == 0, f"{role}: {out.stdout}{out.stderr}"
        for name in ("kvmesh_kv_blocks", "kvmesh_prefix_cache_queries", "kvmesh_num_requests_running",
                     "kvmesh_prompt_tokens_total", "kvmesh_generation_tokens_total", "kvmesh_num_preemptions",
                     "kvmesh_batch_size_tokens", "kvmesh_kv_transfer_bytes_total", "kvmesh_kv_transfer_seconds_total",
                     "kvmesh_kv_transfer_failures_total"):
            assert f"\n{name}" in text, f"{role} lacks {name}"
    # The earlier tests moved KV from the prefill worker to the decode worker.
    sent = _metric(_worker_metrics(cluster, "prefill"), "kvmesh_kv_transfer_bytes_total", '{direction="sent"}')
    received = _metric(_worker_metrics(cluster, "decode"), "kvmesh_kv_transfer_bytes_total", '{direction="received"}')
    assert sent > 0 and sent == received, (sent, received)
    decode = _worker_metrics(cluster, "decode")
    assert _metric(decode, "kvmesh_time_to_first_token_seconds_count") > 0
    assert _metric(decode, "kvmesh_generation_tokens_total") > 0


def _stream_then_disconnect(url, prompt, max_tokens, events_before_leaving):
    """Starts a streaming completion and closes the connection after some SSE events."""
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True})
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    if events_before_leaving > 0:
        resp = conn.getresponse()
        assert resp.status == 200
        seen = 0
        while seen < events_before_leaving:
            line = resp.readline()
            assert line, "the stream ended before the client left"
            seen += line.startswith(b"data: ")
    conn.sock.shutdown(2)
    conn.close()


def _kv_blocks_used_eventually_zero(cluster):
    deadline = time.time() + 15
    used = {}
    while time.time() < deadline:
        used = {role: _metric(_worker_metrics(cluster, role), "kvmesh_kv_blocks", '{state="used"}')
                for role in ("prefill", "decode")}
        if all(v == 0 for v in used.values()):
            return used
        time.sleep(0.2)
    raise AssertionError(f"KV blocks still used after the client left: {used}{cluster.logs()}")


def test_a_client_disconnecting_mid_stream_frees_kv_blocks_on_both_workers(cluster):
    # Mid-stream: the decode worker is generating.
    _stream_then_disconnect(cluster.url, "A client that leaves in the middle " * 6, 2000, 5)
    _kv_blocks_used_eventually_zero(cluster)
    # Before the first token: a long prompt still being prefilled (or transferred).
    _stream_then_disconnect(cluster.url, "A long prompt whose client leaves early " * 60, 2000, 0)
    _kv_blocks_used_eventually_zero(cluster)
    # Both workers still serve.
    assert _complete(_client(cluster.url), PROMPTS[0])[1] == "length"
    # A client leaving is no fault of the prefill worker: the decode worker, which ended
    # the transfer itself, did not report it unreachable (that would stop placements on it).
    with open(os.path.join(cluster.run_dir, "scheduler.log"), errors="replace") as f:
        assert "worker reported unreachable" not in f.read(), cluster.logs()


def _start_worker_binary(path, *args):
    proc = subprocess.Popen([path, "--listen=127.0.0.1:0", "--metrics-port=0", "--kv-cache-bytes", str(64 << 20),
                             *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    address = metrics = None
    deadline = time.time() + 120
    while time.time() < deadline and not (address and metrics):
        line = proc.stderr.readline()
        if not line:
            break
        m = re.search(r"worker listening on (\S+)", line)
        address = m.group(1) if m else address
        m = re.search(r"worker metrics on (http://\S+)/metrics", line)
        metrics = m.group(1) if m else metrics
    assert address and metrics, f"{path} did not start"
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    return proc, address, metrics


def test_the_role_binaries_serve_a_disaggregated_request():
    prefill_bin, decode_bin = os.environ.get("KVMESH_PREFILL_WORKER_BIN"), os.environ.get("KVMESH_DECODE_WORKER_BIN")
    if not prefill_bin or not decode_bin:
        pytest.skip("KVMESH_PREFILL_WORKER_BIN / KVMESH_DECODE_WORKER_BIN not set")
    stubs = _scheduler_stubs()
    if stubs is None:
        pytest.skip("grpcio / grpcio-tools missing")
    grpc = stubs[0]
    wpb = importlib.import_module("kvmesh.v1.worker_pb2")
    wpb_grpc = importlib.import_module("kvmesh.v1.worker_pb2_grpc")
    # A role binary refuses the other role.
    out = subprocess.run([prefill_bin, "--role=decode"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "role" in out.stderr, out.stderr
    prefill, prefill_address, prefill_metrics = _start_worker_binary(prefill_bin)
    decode, decode_address, decode_metrics = _start_worker_binary(decode_bin)
    try:
        with grpc.insecure_channel(decode_address) as channel:
            request = wpb.WorkerGenerateRequest(request_id="bin-1", prompt_token_ids=list(range(5, 70)),
                                                prefill_worker_address=prefill_address)
            request.sampling.temperature = 0
            request.sampling.max_tokens = 8
            request.sampling.ignore_eos = True
            tokens = [t for r in wpb_grpc.WorkerStub(channel).Generate(request, timeout=60) for t in r.token_ids]
        assert len(tokens) == 8
        for url in (prefill_metrics, decode_metrics):
            with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
                text = r.read().decode()
            check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
            assert check.returncode == 0, check.stdout + check.stderr
            assert re.search(r'^kvmesh_kv_blocks\{state="used"\} 0$', text, re.M), text
        with urllib.request.urlopen(prefill_metrics + "/metrics", timeout=10) as r:
            assert _metric(r.read().decode(), "kvmesh_kv_transfer_bytes_total", '{direction="sent"}') > 0
    finally:
        for proc in (prefill, decode):
            proc.send_signal(signal.SIGTERM)
        for proc in (prefill, decode):
            assert proc.wait(timeout=60) == 0


def test_killing_the_prefill_worker_falls_back_to_a_local_prefill_and_leaks_nothing(cluster):
    stubs = _scheduler_stubs()
    client = _client(cluster.url)
    prefill = cluster.pid("prefill")
    # Freeze the prefill worker so the request is surely in flight on it, then kill it:
    # the decode worker notices (keepalive, then the reset), fails the lease and
    # prefills the request itself. The client sees tokens, not an error.
    os.kill(prefill, signal.SIGSTOP)
    threading.Timer(1.0, lambda: os.kill(prefill, signal.SIGKILL)).start()
    prompt = "A request whose prefill worker dies " * 8
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
    assert r.choices[0].finish_reason == "length", r
    decode = _worker_metrics(cluster, "decode")
    assert _metric(decode, "kvmesh_kv_remote_prefill_fallbacks") >= 1, decode + cluster.logs()
    if stubs is not None:
        deadline = time.time() + 10
        load = None
        while time.time() < deadline:
            load = _decode_load(stubs, cluster)
            if load is not None and load.kv_blocks_used == 0 and load.num_running_seqs == 0:
                break
            time.sleep(0.2)
        assert load is not None and load.kv_blocks_used == 0 and load.num_running_seqs == 0, f"{load}{cluster.logs()}"
    # At once (the decode worker reported the dead prefill worker to the scheduler, or it
    # falls back again): no error while the scheduler still lists it.
    text, reason = _complete(client, PROMPTS[0])
    assert reason == "length"
    assert _metric(_worker_metrics(cluster, "decode"), "kvmesh_kv_blocks_stranded") == 0
    out = cluster.stop()
    assert out.returncode == 0, out.stderr
    assert "killing" not in out.stderr, out.stderr + cluster.logs()
