"""Prefill -> decode KV over UCX with real worker processes (kvmesh-prefill-worker and
kvmesh-decode-worker, driven over grpcio):

- greedy tokens over UCX (loopback shm/cma), over the gRPC stream (--kv-transport grpc)
  and aggregated (one worker prefilling itself) are identical, and the metrics say which
  transport carried the KV; the same with TP=2 workers on both sides (rank to rank),
  and a TP=2 prefill worker refuses a TP=1 decode worker, which then prefills itself;
- as root, the prefill worker in its own network namespace joined to the decode worker's
  by a veth pair, UCX over tcp between the two addresses (skipped, saying why, where
  namespaces cannot be made);
- faults: the prefill worker stopped (SIGSTOP) or killed (SIGKILL) mid-transfer, over
  UCX and over the gRPC stream: the decode worker fails the lease, frees its blocks and
  prefills the request itself (it ends with tokens); the decode worker killed
  mid-transfer: the prefill worker frees its blocks. No KV block stays in use on a
  surviving worker.
"""

import importlib
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

grpc = pytest.importorskip("grpc")
protoc = pytest.importorskip("grpc_tools.protoc")

PREFILL = os.environ.get("KVMESH_PREFILL_WORKER_BIN")
DECODE = os.environ.get("KVMESH_DECODE_WORKER_BIN")
PROTO_DIR = os.environ.get("KVMESH_PROTO_DIR",
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto"))
if not PREFILL or not DECODE:
    pytest.skip("KVMESH_PREFILL_WORKER_BIN / KVMESH_DECODE_WORKER_BIN not set", allow_module_level=True)


def _stubs():
    out = tempfile.mkdtemp(prefix="kvmesh-kv-transport-stubs-")
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    rc = protoc.main(["grpc_tools.protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={out}",
                      f"--grpc_python_out={out}", "kvmesh/v1/common.proto", "kvmesh/v1/worker.proto"])
    assert rc == 0
    sys.path.insert(0, out)
    return importlib.import_module("kvmesh.v1.worker_pb2"), importlib.import_module("kvmesh.v1.worker_pb2_grpc")


wpb, wpb_grpc = _stubs()

# 40 blocks of 16 tokens plus a partial one: several layers' worth of puts.
PROMPT = [(i * 7919) % 500 + 5 for i in range(650)]
# Long enough that the prefill is still computing (and putting) when the fault comes.
LONG_PROMPT = [(i * 104729) % 700 + 5 for i in range(1900)]


class Worker:
    def __init__(self, binary, *args, listen="127.0.0.1:0", netns=None, env=None):
        cmd = [binary, f"--listen={listen}", "--metrics-port=0", "--metrics-host=0.0.0.0",
               "--kv-cache-bytes", str(96 << 20), *args]
        if netns:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        self.log = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, **(env or {})))
        self.address = self.metrics = None
        deadline = time.time() + 120
        while time.time() < deadline and not (self.address and self.metrics):
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"worker listening on (\S+)", line)
            self.address = m.group(1) if m else self.address
            m = re.search(r"worker metrics on http://\S+:(\d+)/metrics", line)
            self.metrics = m.group(1) if m else self.metrics
        assert self.address and self.metrics, f"{binary} did not start:\n{''.join(self.log)}"
        self.transport = "ucx" if any("kv_transport=ucx" in l for l in self.log) else "grpc"
        threading.Thread(target=lambda: [self.log.append(l) for l in self.proc.stderr], daemon=True).start()

    def metrics_text(self):
        host = self.address.rsplit(":", 1)[0]
        with urllib.request.urlopen(f"http://{host}:{self.metrics}/metrics", timeout=10) as r:
            return r.read().decode()

    def metric(self, name, labels=""):
        m = re.search(r"^" + re.escape(name + labels) + r" (\S+)$", self.metrics_text(), re.M)
        return float(m.group(1)) if m else 0.0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _generate(decode, prefill_address, prompt, max_tokens=12, request_id="r", timeout=60):
    with grpc.insecure_channel(decode.address) as channel:
        request = wpb.WorkerGenerateRequest(request_id=request_id, prompt_token_ids=prompt,
                                            prefill_worker_address=prefill_address or "",
                                            prefill_locally=not prefill_address)
        request.sampling.temperature = 0
        request.sampling.max_tokens = max_tokens
        request.sampling.ignore_eos = True
        return [t for r in wpb_grpc.WorkerStub(channel).Generate(request, timeout=timeout) for t in r.token_ids]


def _blocks_used_eventually_zero(worker, what):
    """Every block of `worker` back (none used) and none stranded (pinned or leased past
    its deadline, or held by no live request)."""
    assert re.search(r"^kvmesh_kv_blocks_stranded ", worker.metrics_text(), re.M), "no stranded-blocks gauge"
    deadline = time.time() + 15
    used = stranded = None
    while time.time() < deadline:
        used = worker.metric("kvmesh_kv_blocks", '{state="used"}')
        stranded = worker.metric("kvmesh_kv_blocks_stranded")
        if used == 0 and stranded == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"{what}: {used} KV blocks still used, {stranded} stranded\n{''.join(worker.log[-30:])}")


@pytest.fixture(scope="module")
def reference_tokens():
    """Greedy tokens of PROMPT from one worker prefilling itself (aggregated)."""
    both = Worker(DECODE)
    try:
        return _generate(both, None, PROMPT, request_id="ref")
    finally:
        both.stop()


@pytest.fixture(scope="module")
def reference_tokens_tp2():
    """Greedy tokens of PROMPT from one TP=2 worker prefilling itself (aggregated)."""
    both = Worker(DECODE, "--tensor-parallel-size=2")
    try:
        return _generate(both, None, PROMPT, request_id="ref-tp2")
    finally:
        both.stop()


def _pair(*args, prefill_env=None, decode_env=None):
    prefill = Worker(PREFILL, *args, env=prefill_env)
    try:
        decode = Worker(DECODE, *args, env=decode_env)
    except BaseException:
        prefill.stop()
        raise
    return prefill, decode


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("transport", ["ucx", "grpc"])
def test_greedy_tokens_over_each_transport_equal_aggregated(reference_tokens, reference_tokens_tp2, transport, tp):
    # With TP=2 on both sides each rank moves its own KV heads to the peer's same rank.
    prefill, decode = _pair(f"--kv-transport={transport}", f"--tensor-parallel-size={tp}")
    expected = reference_tokens if tp == 1 else reference_tokens_tp2
    try:
        assert prefill.transport == transport and decode.transport == transport
        assert any(f"tp_size={tp}" in l for l in decode.log), "".join(decode.log[-10:])
        for i in range(2):  # the second time the decode worker's prefix cache holds most blocks
            assert _generate(decode, prefill.address, PROMPT, request_id=f"{transport}-{i}") == expected
        ok = prefill.metric("kvmesh_kv_transfers_total", f'{{direction="sent",transport="{transport}",result="ok"}}')
        assert ok == 2, "".join(prefill.log[-30:])
        sent = prefill.metric("kvmesh_kv_transfer_bytes_total", '{direction="sent"}')
        received = decode.metric("kvmesh_kv_transfer_bytes_total", '{direction="received"}')
        assert sent > 0 and sent == received, (sent, received)
        if transport == "ucx":
            # One put per rank, layer and merged run: a fresh pool hands out consecutive blocks.
            descriptors = prefill.metric("kvmesh_kv_transfer_descriptors_total", '{direction="sent",transport="ucx"}')
            assert 0 < descriptors <= tp * 2 * 8 * 4, descriptors
        assert decode.metric("kvmesh_kv_remote_prefill_fallbacks") == 0
        for w in (prefill, decode):
            _blocks_used_eventually_zero(w, f"after the TP={tp} {transport} transfers")
    finally:
        decode.stop()
        prefill.stop()


def test_tensor_parallel_sizes_that_differ_are_refused_and_prefilled_locally(reference_tokens):
    # KV moves rank to rank: a TP=2 prefill worker refuses a TP=1 decode worker's lease,
    # saying why, and the decode worker prefills the request itself.
    prefill = Worker(PREFILL, "--tensor-parallel-size=2")
    decode = Worker(DECODE)
    try:
        assert _generate(decode, prefill.address, PROMPT, request_id="tp-mismatch") == reference_tokens
        assert decode.metric("kvmesh_kv_remote_prefill_fallbacks") == 1
        assert any("tensor-parallel size" in l for l in decode.log), "".join(decode.log[-10:])
        for w in (prefill, decode):
            _blocks_used_eventually_zero(w, "after the refused transfer")
    finally:
        decode.stop()
        prefill.stop()


def test_auto_prefers_ucx_and_falls_back_to_grpc_against_a_grpc_only_peer(reference_tokens):
    prefill = Worker(PREFILL, "--kv-transport=grpc")
    decode = Worker(DECODE, "--kv-transport=auto")
    try:
        assert decode.transport == "ucx"
        assert _generate(decode, prefill.address, PROMPT, request_id="fallback") == reference_tokens
        assert prefill.metric("kvmesh_kv_transfers_total", '{direction="sent",transport="grpc",result="ok"}') == 1
        _blocks_used_eventually_zero(decode, "after the fallback")
    finally:
        decode.stop()
        prefill.stop()


NS = "kvmesh-kvt-prefill"
VETH_ROOT, VETH_NS = "kvkvt0", "kvkvt1"
ROOT_IP, NS_IP = "10.213.9.1", "10.213.9.2"


def _sh(*cmd):
    return subprocess.run(list(cmd), capture_output=True, text=True)


@pytest.fixture
def namespace():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    _sh("ip", "link", "del", VETH_ROOT)
    _sh("ip", "netns", "del", NS)
    steps = [("ip", "netns", "add", NS), ("ip", "link", "add", VETH_ROOT, "type", "veth", "peer", "name", VETH_NS),
             ("ip", "link", "set", VETH_NS, "netns", NS), ("ip", "addr", "add", f"{ROOT_IP}/24", "dev", VETH_ROOT),
             ("ip", "link", "set", VETH_ROOT, "up"), ("ip", "-n", NS, "addr", "add", f"{NS_IP}/24", "dev", VETH_NS),
             ("ip", "-n", NS, "link", "set", VETH_NS, "up"), ("ip", "-n", NS, "link", "set", "lo", "up")]
    for step in steps:
        out = _sh(*step)
        if out.returncode != 0:
            _sh("ip", "link", "del", VETH_ROOT)
            _sh("ip", "netns", "del", NS)
            pytest.skip(f"cannot make a network namespace here ({' '.join(step)}: {out.stderr.strip()})")
    yield
    _sh("ip", "link", "del", VETH_ROOT)
    _sh("ip", "netns", "del", NS)


@pytest.mark.parametrize("tp", [1, 2])
def test_ucx_tcp_between_two_network_namespaces(reference_tokens, reference_tokens_tp2, namespace, tp):
    # Each side sees only its end of the veth pair: UCX's tcp transport runs between real
    # addresses (shared memory is ruled out by --ucx-tls=tcp). With TP=2 each rank's own
    # UCX worker connects to the peer's same rank.
    args = ["--kv-transport=ucx", "--ucx-tls=tcp", f"--tensor-parallel-size={tp}"]
    prefill = Worker(PREFILL, *args, listen=f"{NS_IP}:0", netns=NS, env={"UCX_NET_DEVICES": VETH_NS})
    decode = Worker(DECODE, *args, listen=f"{ROOT_IP}:0", env={"UCX_NET_DEVICES": VETH_ROOT})
    try:
        expected = reference_tokens if tp == 1 else reference_tokens_tp2
        assert _generate(decode, prefill.address, PROMPT, request_id="netns") == expected
        assert prefill.metric("kvmesh_kv_transfers_total", '{direction="sent",transport="ucx",result="ok"}') == 1
        _blocks_used_eventually_zero(decode, "after the namespaced transfer")
    finally:
        decode.stop()
        prefill.stop()


def _generate_in_background(decode, prefill_address, prompt):
    result = {}

    def run():
        start = time.time()
        try:
            result["tokens"] = _generate(decode, prefill_address, prompt, max_tokens=4, request_id="fault", timeout=60)
        except grpc.RpcError as e:
            result["error"] = e
        result["ended"] = time.time()
        result["started"] = start

    t = threading.Thread(target=run)
    t.start()
    return t, result


# "ucx" writes by cross-memory attach on one host; "ucx-tcp" sends each run as a
# rendezvous active message over tcp, as between hosts.
@pytest.mark.parametrize("transport", ["ucx", "ucx-tcp", "grpc"])
@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL])
def test_prefill_worker_stopped_or_killed_mid_transfer_falls_back_to_a_local_prefill(sig, transport):
    args = ["--kv-transport=ucx", "--ucx-tls=tcp"] if transport == "ucx-tcp" else [f"--kv-transport={transport}"]
    prefill, decode = _pair(*args, "--kv-lease-timeout-ms=30000")
    try:
        t, result = _generate_in_background(decode, prefill.address, LONG_PROMPT)
        time.sleep(0.3)  # the Prefill call is in, its Hello answered, layers being computed and put
        fault_at = time.time()
        os.kill(prefill.proc.pid, sig)
        t.join(timeout=30)
        assert not t.is_alive(), "the request did not end after the prefill worker's fault"
        ended_after = result["ended"] - fault_at
        print(f"\n{signal.Signals(sig).name} over {transport}: the request ended {ended_after:.2f} s after the fault")
        # The decode worker noticed (UCX's progress deadline, the channel's keepalive or
        # the reset), failed the lease and prefilled the request itself: tokens, no error.
        assert "error" not in result, result["error"]
        assert len(result["tokens"]) == 4
        assert decode.proc.poll() is None, "the decode worker died:\n" + "".join(decode.log[-40:])
        assert decode.metric("kvmesh_kv_remote_prefill_fallbacks") == 1, "".join(decode.log[-30:])
        if sig == signal.SIGSTOP and transport == "ucx":
            # A stopped writer by cross-memory attach may still write into the failed
            # lease's blocks whenever it resumes (the decode worker cannot refuse it):
            # they stay quarantined, not stranded, until it says it stopped.
            quarantined = decode.metric("kvmesh_kv_blocks_quarantined")
            print(f"{quarantined:.0f} blocks quarantined while the prefill worker is stopped")
            assert decode.metric("kvmesh_kv_blocks_stranded") == 0
            os.kill(prefill.proc.pid, signal.SIGCONT)
        _blocks_used_eventually_zero(decode, "decode worker after the prefill worker's fault")
        assert decode.metric("kvmesh_kv_blocks_stranded") == 0
        assert decode.metric("kvmesh_kv_blocks_quarantined") == 0
        if sig == signal.SIGSTOP:
            # Resumed, the prefill worker is refused by the decode side and frees its pins.
            os.kill(prefill.proc.pid, signal.SIGCONT)
            _blocks_used_eventually_zero(prefill, "prefill worker resumed after its lease failed")
    finally:
        decode.stop()
        prefill.stop()


@pytest.mark.parametrize("tls", ["", "tcp"])
def test_decode_worker_killed_mid_transfer_frees_the_prefill_workers_blocks(tls):
    tls_args = [f"--ucx-tls={tls}"] if tls else []
    prefill, decode = _pair("--kv-transport=ucx", *tls_args, "--kv-lease-timeout-ms=30000")
    try:
        t, result = _generate_in_background(decode, prefill.address, LONG_PROMPT)
        time.sleep(0.3)
        os.kill(decode.proc.pid, signal.SIGKILL)
        t.join(timeout=30)
        assert not t.is_alive()
        assert "error" in result or len(result.get("tokens", [])) == 4
        _blocks_used_eventually_zero(prefill, "prefill worker after the decode worker died")
        # A refused put cancels the push: the layers after it are not tried (nor logged) again.
        refusals = sum("UCX put refused" in l for l in prefill.log)
        assert refusals <= 1, "".join(prefill.log[-30:])
        # And it still serves: a new decode worker gets its KV.
        decode2 = Worker(DECODE, "--kv-transport=ucx", *tls_args)
        try:
            assert len(_generate(decode2, prefill.address, PROMPT, request_id="after")) == 12
        finally:
            decode2.stop()
    finally:
        decode.stop()
        prefill.stop()
