"""The kv-store's wire from a client of another language (Python stubs generated from
proto/): with mutual TLS on, a peer without a valid client certificate can neither look
up, put nor get; with --api_keys, a call without the key is UNAUTHENTICATED; malformed
requests are refused by code; /metrics (promtool), a clean SIGTERM, the flags'
validation, and `kvmesh kv-store` as a CLI subcommand. The C++ client's side (restarts,
SIGSTOP, SIGKILL mid-get, salts, two stores) is kv_store_integration_test.cc."""

import ctypes
import ctypes.util
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.request

import pytest

import certs as certs_lib
import grpc_stubs

grpc = pytest.importorskip("grpc")
protoc = pytest.importorskip("grpc_tools.protoc")

STORE = os.environ["KVMESH_KV_STORE_BIN"]
KVMESH = os.environ.get("KVMESH_BIN")
PROTO_DIR = os.environ.get("KVMESH_PROTO_DIR",
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto"))

pb, pb_grpc, health_pb, health_grpc = grpc_stubs.load(
    protoc, PROTO_DIR, ["kvmesh/v1/kv_store.proto"], ["kvmesh.v1.kv_store_pb2", "kvmesh.v1.kv_store_pb2_grpc"])

BLOCK_BYTES = 4096


def _xxh3_64():
    """kv::Checksum (XXH3-64, seed 0) from the system's libxxhash, which the store links."""
    lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
    fn = lib.XXH3_64bits
    fn.restype = ctypes.c_uint64
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return lambda data: fn(data, len(data))


checksum = _xxh3_64()


class Store:
    """kvmesh-kv-store (or `kvmesh kv-store`) on 127.0.0.1 with free ports."""

    def __init__(self, *args, command=None):
        cmd = (command or [STORE]) + ["--listen=127.0.0.1:0", "--metrics-port=0", f"--block-bytes={BLOCK_BYTES}",
                                      "--capacity-blocks=64", *args]
        self.log = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.address = self.metrics_port = None
        deadline = time.time() + 60
        while time.time() < deadline and not self.address:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"kv-store metrics on http://\S+:(\d+)/metrics", line)
            self.metrics_port = m.group(1) if m else self.metrics_port
            m = re.search(r"kv-store listening .* port=(\d+)", line)
            self.address = f"127.0.0.1:{m.group(1)}" if m else None
        assert self.address and self.metrics_port, f"{cmd} did not start:\n{''.join(self.log)}"
        threading.Thread(target=lambda: [self.log.append(l) for l in self.proc.stderr], daemon=True).start()

    def metrics_text(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self):
        """SIGTERM; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def store_factory():
    stores = []

    def make(*args, command=None):
        stores.append(Store(*args, command=command))
        return stores[-1]

    yield make
    for s in stores:
        s.stop()


def _key(n):
    return pb.KvStoreKey(low=n, high=0x5a17)


def _put(stub, keys, data, metadata=None, timeout=10):
    """PutIntent then Put of `data` under each key; the Put response."""
    intent = stub.PutIntent(pb.KvPutIntentRequest(keys=keys, block_bytes=len(data)), metadata=metadata,
                            timeout=timeout)
    blocks = [pb.KvPutBlock(epoch=intent.epoch, key=k, token=b.token, checksum=checksum(data), data=data)
              for k, b in zip(keys, intent.blocks) if b.outcome == pb.KvPutIntentResponse.OUTCOME_RESERVED]
    return stub.Put(iter(blocks), metadata=metadata, timeout=timeout)


def _every_call(stub, metadata=None):
    """One call of each method; each raises grpc.RpcError when the store refuses."""
    data = b"\x07" * BLOCK_BYTES
    return {
        "Lookup": lambda: stub.Lookup(pb.KvLookupRequest(keys=[_key(1)]), metadata=metadata, timeout=10),
        "PutIntent": lambda: stub.PutIntent(pb.KvPutIntentRequest(keys=[_key(2)], block_bytes=BLOCK_BYTES),
                                            metadata=metadata, timeout=10),
        "Put": lambda: stub.Put(iter([pb.KvPutBlock(epoch=1, key=_key(3), token=1, checksum=checksum(data),
                                                    data=data)]), metadata=metadata, timeout=10),
        "Get": lambda: list(stub.Get(pb.KvGetRequest(keys=[_key(1)]), metadata=metadata, timeout=10)),
        "Release": lambda: stub.Release(pb.KvReleaseRequest(epoch=1, lease_id=1), metadata=metadata, timeout=10),
        "Stats": lambda: stub.Stats(pb.KvStoreStatsRequest(), metadata=metadata, timeout=10),
        "Events": lambda: stub.Events(pb.KvStoreEventsRequest(max_events=16), metadata=metadata, timeout=10),
    }


@pytest.fixture(scope="module")
def certs():
    directory = certs_lib.make_test_certs("kvmesh-kv-store-tls-")
    if directory is None:
        pytest.skip("openssl is not installed")
    return directory


def _tls_args(directory):
    return [f"--tls-cert={directory}/service.pem", f"--tls-key={directory}/service.key",
            f"--tls-ca={directory}/ca.pem"]


def test_with_mutual_tls_a_credentialed_peer_puts_and_gets_bit_identically(store_factory, certs):
    store = store_factory(*_tls_args(certs))
    creds = grpc.ssl_channel_credentials(root_certificates=certs_lib.read(certs, "ca.pem"),
                                         private_key=certs_lib.read(certs, "service.key"),
                                         certificate_chain=certs_lib.read(certs, "service.pem"))
    data = os.urandom(BLOCK_BYTES)
    with grpc.secure_channel(store.address, creds) as channel:
        stub = pb_grpc.KvStoreStub(channel)
        assert _put(stub, [_key(10)], data).num_committed == 1
        lookup = stub.Lookup(pb.KvLookupRequest(keys=[_key(10), _key(11)]), timeout=10)
        assert lookup.num_present == 1 and lookup.lease_id != 0
        blocks = list(stub.Get(pb.KvGetRequest(epoch=lookup.epoch, lease_id=lookup.lease_id, release_lease=True,
                                               keys=[_key(10)]), timeout=10))
        assert [b.data for b in blocks] == [data]
        assert blocks[0].checksum == checksum(data) and blocks[0].epoch == lookup.epoch
        assert stub.Stats(pb.KvStoreStatsRequest(), timeout=10).num_leases == 0


@pytest.mark.parametrize("who", ["plaintext", "no client certificate", "certificate of another CA"])
def test_with_mutual_tls_a_peer_without_a_valid_client_certificate_cannot_look_up_put_or_get(
        store_factory, certs, who):
    store = store_factory(*_tls_args(certs))
    ca = certs_lib.read(certs, "ca.pem")
    if who == "plaintext":
        channel = grpc.insecure_channel(store.address)
    elif who == "no client certificate":
        channel = grpc.secure_channel(store.address, grpc.ssl_channel_credentials(root_certificates=ca))
    else:
        channel = grpc.secure_channel(store.address, grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=certs_lib.read(certs, "rogue.key"),
            certificate_chain=certs_lib.read(certs, "rogue.pem")))
    with channel:
        for method, call in _every_call(pb_grpc.KvStoreStub(channel)).items():
            with pytest.raises(grpc.RpcError) as error:
                call()
            assert error.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), method
    text = store.metrics_text()
    assert re.search(r"^kvmesh_kv_store_intents 0$", text, re.M), text
    assert re.search(r"^kvmesh_kv_store_lookups 0$", text, re.M), text


def test_with_api_keys_a_call_without_the_key_is_unauthenticated(store_factory):
    store = store_factory("--api-keys=k1,k2")
    with grpc.insecure_channel(store.address) as channel:
        stub = pb_grpc.KvStoreStub(channel)
        for metadata in (None, [("authorization", "Bearer k3")], [("authorization", "k1")]):
            for method, call in _every_call(stub, metadata).items():
                with pytest.raises(grpc.RpcError) as error:
                    call()
                assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED, (method, metadata)
        good = [("authorization", "Bearer k2")]
        assert _put(stub, [_key(20)], b"\x01" * BLOCK_BYTES, metadata=good).num_committed == 1
        assert stub.Lookup(pb.KvLookupRequest(keys=[_key(20)]), metadata=good, timeout=10).num_present == 1


def test_a_ucx_lease_goes_only_to_an_authenticated_caller_and_bad_descriptors_are_refused(store_factory):
    """--data_plane=ucx (libs/kv_store_server/kv_store_data_plane.h): a PutIntent asking for a UCX lease
    without the API key is UNAUTHENTICATED and carries no descriptor (no UCX memory key leaves the store);
    with it, the reserved blocks come with one; a put of another size gets none (the stream is used);
    a Get whose lease descriptor is malformed, or too large, is INVALID_ARGUMENT, and an in-place Put of
    a block that was never written over UCX is refused."""
    store = store_factory("--api-keys=k1", "--data-plane=ucx", "--data-plane-ucx-tls=tcp")
    good = [("authorization", "Bearer k1")]
    with grpc.insecure_channel(store.address) as channel:
        stub = pb_grpc.KvStoreStub(channel)
        ask = pb.KvPutIntentRequest(keys=[_key(40), _key(41)], block_bytes=BLOCK_BYTES, ucx_lease=True)
        for metadata in (None, [("authorization", "Bearer k2")]):
            with pytest.raises(grpc.RpcError) as error:
                stub.PutIntent(ask, metadata=metadata, timeout=10)
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        intent = stub.PutIntent(ask, metadata=good, timeout=10)
        assert [b.outcome for b in intent.blocks] == [pb.KvPutIntentResponse.OUTCOME_RESERVED] * 2
        assert intent.ucx_lease_descriptor[:4] == b"KVLD"
        smaller = stub.PutIntent(pb.KvPutIntentRequest(keys=[_key(42)], block_bytes=BLOCK_BYTES - 64, ucx_lease=True),
                                 metadata=good, timeout=10)
        assert smaller.ucx_lease_descriptor == b""

        def code_of(call):
            with pytest.raises(grpc.RpcError) as error:
                call()
            return error.value.code()

        assert _put(stub, [_key(43)], b"\x03" * BLOCK_BYTES, metadata=good).num_committed == 1
        for descriptor in (b"KVLD garbage", intent.ucx_lease_descriptor[:-1], b"\x00" * (600 << 10)):
            get = pb.KvGetRequest(keys=[_key(43)], ucx_lease_descriptor=descriptor)
            assert code_of(lambda: list(stub.Get(get, metadata=good, timeout=10))) == \
                grpc.StatusCode.INVALID_ARGUMENT
        # Its own lease handed back as a reader's: one destination block per key or nothing.
        get = pb.KvGetRequest(keys=[_key(43)], ucx_lease_descriptor=intent.ucx_lease_descriptor)
        assert code_of(lambda: list(stub.Get(get, metadata=good, timeout=10))) == grpc.StatusCode.INVALID_ARGUMENT
        # Nothing landed in the lent slots: an in-place commit is refused, nothing becomes visible.
        in_place = pb.KvPutBlock(epoch=intent.epoch, key=_key(40), token=intent.blocks[0].token,
                                 checksum=checksum(b"\x00" * BLOCK_BYTES), in_place=True)
        assert code_of(lambda: stub.Put(iter([in_place]), metadata=good, timeout=30)) == \
            grpc.StatusCode.FAILED_PRECONDITION
        assert stub.Lookup(pb.KvLookupRequest(keys=[_key(40)]), metadata=good, timeout=10).num_present == 0
        # The store keeps serving over the stream.
        assert list(stub.Get(pb.KvGetRequest(keys=[_key(43)]), metadata=good, timeout=10))[0].data == \
            b"\x03" * BLOCK_BYTES


def test_malformed_requests_are_refused_by_code_and_the_store_keeps_serving(store_factory):
    store = store_factory()
    with grpc.insecure_channel(store.address) as channel:
        stub = pb_grpc.KvStoreStub(channel)

        def code_of(call):
            with pytest.raises(grpc.RpcError) as error:
                call()
            return error.value.code()

        assert code_of(lambda: stub.Lookup(pb.KvLookupRequest(), timeout=10)) == grpc.StatusCode.INVALID_ARGUMENT
        too_many = [_key(i) for i in range(65537)]
        assert code_of(lambda: stub.Lookup(pb.KvLookupRequest(keys=too_many), timeout=30)) == \
            grpc.StatusCode.INVALID_ARGUMENT
        assert code_of(lambda: stub.PutIntent(pb.KvPutIntentRequest(keys=[_key(1)], block_bytes=BLOCK_BYTES + 1),
                                              timeout=10)) == grpc.StatusCode.INVALID_ARGUMENT
        data = b"\x02" * BLOCK_BYTES
        epoch = stub.Stats(pb.KvStoreStatsRequest(), timeout=10).epoch
        no_intent = pb.KvPutBlock(epoch=epoch, key=_key(5), token=99, checksum=checksum(data), data=data)
        assert code_of(lambda: stub.Put(iter([no_intent]), timeout=10)) == grpc.StatusCode.FAILED_PRECONDITION
        old_epoch = pb.KvPutBlock(epoch=epoch ^ 1, key=_key(5), token=99, checksum=checksum(data), data=data)
        assert code_of(lambda: stub.Put(iter([old_epoch]), timeout=10)) == grpc.StatusCode.FAILED_PRECONDITION
        intent = stub.PutIntent(pb.KvPutIntentRequest(keys=[_key(6)], block_bytes=BLOCK_BYTES), timeout=10)
        corrupt = pb.KvPutBlock(epoch=epoch, key=_key(6), token=intent.blocks[0].token,
                                checksum=checksum(data) ^ 1, data=data)
        assert code_of(lambda: stub.Put(iter([corrupt]), timeout=10)) == grpc.StatusCode.DATA_LOSS
        assert stub.Lookup(pb.KvLookupRequest(keys=[_key(6)]), timeout=10).num_present == 0
        assert code_of(lambda: list(stub.Get(pb.KvGetRequest(keys=[_key(6)]), timeout=10))) == \
            grpc.StatusCode.NOT_FOUND
        stats = stub.Stats(pb.KvStoreStatsRequest(), timeout=10)
        assert stats.checksum_failures == 1 and stats.num_blocks == 0 and stats.num_intents == 0
        assert _put(stub, [_key(7)], data).num_committed == 1
        # The events of what happened: the corrupt put never became visible, key 7 did.
        assert code_of(lambda: stub.Events(pb.KvStoreEventsRequest(max_events=0), timeout=10)) == \
            grpc.StatusCode.INVALID_ARGUMENT
        assert code_of(lambda: stub.Events(pb.KvStoreEventsRequest(max_events=1, snapshot_cursor=-1), timeout=10)) \
            == grpc.StatusCode.INVALID_ARGUMENT
        events = stub.Events(pb.KvStoreEventsRequest(max_events=16), timeout=10)
        assert events.reset and events.epoch == epoch
        assert [(e.key.low, e.removed) for e in events.events] == [(_key(7).low, False)]


def test_metrics_and_a_clean_exit_on_sigterm(store_factory):
    store = store_factory()
    with grpc.insecure_channel(store.address) as channel:
        stub = pb_grpc.KvStoreStub(channel)
        _put(stub, [_key(1), _key(2)], b"\x03" * BLOCK_BYTES)
        stub.Lookup(pb.KvLookupRequest(keys=[_key(1), _key(3)]), timeout=10)
        epoch = stub.Stats(pb.KvStoreStatsRequest(), timeout=10).epoch
    text = store.metrics_text()
    expected = {"kvmesh_kv_store_blocks": 2, "kvmesh_kv_store_bytes": 2 * BLOCK_BYTES,
                "kvmesh_kv_store_capacity_blocks": 64, "kvmesh_kv_store_queried_blocks": 2,
                "kvmesh_kv_store_hit_blocks": 1, "kvmesh_kv_store_put_bytes": 2 * BLOCK_BYTES,
                "kvmesh_kv_store_leases": 1, "kvmesh_kv_store_intents": 0, "kvmesh_kv_store_checksum_failures": 0}
    for name, value in expected.items():
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        assert m and float(m.group(1)) == value, (name, text)
    assert f'kvmesh_kv_store_epoch_info{{epoch="{epoch:016x}"}} 1' in text
    assert 'kvmesh_kv_store_requests_total{method="Put",code="OK"} 1' in text
    if shutil.which("promtool"):
        check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
    assert store.stop() == 0, "".join(store.log)
    assert any("kv-store stopped" in l for l in store.log)


@pytest.mark.parametrize("args,message", [
    ([], "--block_bytes is required"),
    (["--block-bytes=4096"], "give one of --capacity_bytes and --capacity_blocks"),
    (["--block-bytes=4096", "--capacity-blocks=4", "--capacity-bytes=65536"],
     "give one of --capacity_bytes and --capacity_blocks"),
    (["--block-bytes=4096", "--capacity-bytes=4095"], "holds no block"),
    (["--block-bytes=4096", "--capacity-blocks=4", "--lease-ms=100", "--max-lease-ms=50"], "--max_lease_ms=50"),
    (["--block-bytes=-1", "--capacity-blocks=4"], "block_bytes"),
])
def test_bad_flags_are_refused_at_start(args, message):
    out = subprocess.run([STORE, "--listen=127.0.0.1:0", *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr


def test_the_kvmesh_cli_runs_the_same_store(store_factory):
    if not KVMESH:
        pytest.skip("KVMESH_BIN is not set")
    assert "kv-store" in subprocess.run([KVMESH, "--help"], capture_output=True, text=True).stdout
    help_text = subprocess.run([KVMESH, "kv-store", "--help"], capture_output=True, text=True).stdout
    assert "--capacity_bytes" in help_text or "capacity_bytes" in help_text
    store = store_factory(command=[KVMESH, "kv-store"])
    with grpc.insecure_channel(store.address) as channel:
        stub = pb_grpc.KvStoreStub(channel)
        assert _put(stub, [_key(1)], b"\x04" * BLOCK_BYTES).num_committed == 1
        health = health_grpc.HealthStub(channel).Check(health_pb.HealthCheckRequest(service="kvmesh.v1.KvStore"),
                                                       timeout=10)
        assert health.status == health_pb.HealthCheckResponse.SERVING
    assert store.stop() == 0, "".join(store.log)
