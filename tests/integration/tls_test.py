"""Mutual TLS between every service: certificates made with `openssl` at test time, a
cluster (tools/dev-cluster --tls-dir: scheduler, prefill and decode workers, router)
serving over mTLS, and peers without a valid client certificate refused."""

import json
import os
import subprocess
import sys
import tempfile
import urllib.request

import pytest

import certs as certs_lib
import grpc_stubs

grpc = pytest.importorskip("grpc")
protoc = pytest.importorskip("grpc_tools.protoc")

KVMESH = os.environ["KVMESH_BIN"]
SCHEDULER = os.environ["KVMESH_SCHEDULER_BIN"]
PROTO_DIR = os.environ.get("KVMESH_PROTO_DIR",
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto"))
DEV_CLUSTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "dev-cluster")

pb, pb_grpc, common, sched_pb, sched_grpc, health_pb, health_grpc = grpc_stubs.load(
    protoc, PROTO_DIR, ["kvmesh/v1/common.proto", "kvmesh/v1/api.proto", "kvmesh/v1/scheduler.proto"],
    ["kvmesh.v1.api_pb2", "kvmesh.v1.api_pb2_grpc", "kvmesh.v1.common_pb2", "kvmesh.v1.scheduler_pb2",
     "kvmesh.v1.scheduler_pb2_grpc"])


@pytest.fixture(scope="module")
def certs():
    directory = certs_lib.make_test_certs("kvmesh-tls-")
    if directory is None:
        pytest.skip("openssl is not installed")
    return directory


@pytest.fixture(scope="module")
def cluster(certs):
    run_dir = tempfile.mkdtemp(prefix="kvmesh-tls-cluster-")
    env = dict(os.environ, KVMESH_BIN=KVMESH, KVMESH_SCHEDULER_BIN=SCHEDULER)
    out = subprocess.run([sys.executable, DEV_CLUSTER, "start", "--run-dir", run_dir, "--heartbeat-ms", "100",
                          "--tls-dir", certs], capture_output=True, text=True, env=env, timeout=300)
    logs = ""
    for name in ("scheduler", "prefill", "decode", "router"):
        path = os.path.join(run_dir, f"{name}.log")
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                logs += f"\n--- {name}.log ---\n" + f.read()[-3000:]
    assert out.returncode == 0, out.stderr + logs
    state = json.loads(out.stdout)
    yield state["processes"]
    stopped = subprocess.run([sys.executable, DEV_CLUSTER, "stop", "--run-dir", run_dir],
                             capture_output=True, text=True, env=env, timeout=120)
    assert stopped.returncode == 0, stopped.stderr


def test_the_cluster_serves_a_disaggregated_request_over_mutual_tls(cluster):
    # Router -> scheduler, router -> decode worker, decode -> prefill worker (KV push),
    # workers -> scheduler (heartbeats): every hop is mTLS.
    body = {"model": "tiny-llama", "prompt": "Paged attention stores keys and values", "max_tokens": 8,
            "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request(cluster["router"]["url"] + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.loads(r.read())
    assert out["usage"]["completion_tokens"] == 8
    assert out["choices"][0]["text"]


def _list_workers(address, credentials):
    channel = (grpc.insecure_channel(address) if credentials is None
               else grpc.secure_channel(address, credentials))
    with channel:
        return sched_grpc.SchedulerStub(channel).ListWorkers(sched_pb.ListWorkersRequest(), timeout=10)


def test_a_peer_with_the_clusters_client_certificate_is_served(cluster, certs):
    creds = grpc.ssl_channel_credentials(root_certificates=certs_lib.read(certs, "ca.pem"),
                                         private_key=certs_lib.read(certs, "service.key"),
                                         certificate_chain=certs_lib.read(certs, "service.pem"))
    workers = _list_workers(cluster["scheduler"]["address"], creds).workers
    assert sorted(w.worker_id for w in workers) == ["dev-decode", "dev-prefill"]


@pytest.mark.parametrize("who", ["plaintext", "no client certificate", "certificate of another CA"])
@pytest.mark.parametrize("service", ["scheduler", "decode"])
def test_a_peer_without_a_valid_client_certificate_is_refused(cluster, certs, who, service):
    ca = certs_lib.read(certs, "ca.pem")
    if who == "plaintext":
        creds = None
    elif who == "no client certificate":
        creds = grpc.ssl_channel_credentials(root_certificates=ca)
    else:
        creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=certs_lib.read(certs, "rogue.key"),
                                             certificate_chain=certs_lib.read(certs, "rogue.pem"))
    address = cluster[service]["address"]
    channel = grpc.insecure_channel(address) if creds is None else grpc.secure_channel(address, creds)
    with channel:
        # The standard health service answers anyone the transport lets through.
        stub = health_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            stub.Check(health_pb.HealthCheckRequest(service=""), timeout=10)
        assert error.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_the_routers_client_api_uses_tls_without_a_client_certificate(cluster, certs):
    creds = grpc.ssl_channel_credentials(root_certificates=certs_lib.read(certs, "ca.pem"))
    with grpc.secure_channel(cluster["router"]["grpc_address"], creds) as channel:
        models = pb_grpc.InferenceStub(channel).ListModels(pb.ListModelsRequest(), timeout=30)
    assert [m.id for m in models.models] == ["tiny-llama"]
