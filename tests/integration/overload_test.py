"""Overload (#14, "It must show"): 4x the admitted capacity for a bounded time (30 s),
with streaming clients over the real `openai` client that come back 0.1 s after a
refusal, against `kvmesh serve` and against a router in front of the dev cluster.
Admitted requests must keep their TTFT p99 within TTFT_BOUND_S (a generous bound, the
only timing asserted); every other request must be refused with 429 or 503 and a
Retry-After; nothing hangs, is truncated or fails otherwise; every process stays alive
and its RSS within RSS_GROWTH_BOUND of what it was before the overload; afterwards a
plain request is served. The figures (requests by outcome, TTFT p50/p99 of admitted
requests, peak RSS growth) are printed with their ratio to the bound."""

import os
import signal
import subprocess
import threading
import time
import re

import pytest

openai = pytest.importorskip("openai")

import fault_load  # noqa: E402

KVMESH = os.environ.get("KVMESH_BIN")
SCHEDULER = os.environ.get("KVMESH_SCHEDULER_BIN")
if not KVMESH:
    pytest.skip("KVMESH_BIN not set", allow_module_level=True)

CAPACITY = 4  # --max_inflight_requests: sequences admitted at once
OVERLOAD_S = float(os.environ.get("KVMESH_OVERLOAD_S", "30"))
TTFT_BOUND_S = 10.0
RSS_GROWTH_BOUND = 256 << 20
MAX_TOKENS = 24


def prompt_fn(i):
    return f"Request {i}: the quick brown fox jumps over the lazy dog, and then"


class Proc:
    """A kvmesh process whose log line `pattern` names its URL."""

    def __init__(self, argv, pattern):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.log = []
        self.url = None
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(pattern, line)
            if m:
                self.url = m.group(1)
                break
        assert self.url, "did not start:\n" + "".join(self.log)
        threading.Thread(target=lambda: [self.log.append(l) for l in self.proc.stdout], daemon=True).start()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def _overload(url, pids, label):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    for i in range(3):  # warm up: caches, threads, allocator
        assert fault_load.one_stream(client, prompt_fn(i), MAX_TOKENS, 60).kind == "ok"
    baseline = {p: fault_load.rss_bytes(p) for p in pids}
    sampler = fault_load.RssSampler(pids).start()
    load = fault_load.StreamLoad(url, concurrency=4 * CAPACITY, prompt_fn=prompt_fn, max_tokens=MAX_TOKENS,
                                 timeout_s=120, refused_pause_s=0.1).start()
    time.sleep(OVERLOAD_S)
    hung = load.stop()
    peaks = sampler.stop()
    outcomes = load.outcomes
    kinds = fault_load.summarize(outcomes, f"{label}: {4 * CAPACITY} clients, capacity {CAPACITY}, {OVERLOAD_S:.0f} s")
    admitted = [o for o in outcomes if o.kind == "ok"]
    refused = [o for o in outcomes if o.kind == "refused"]
    ttft = [o.first - o.start for o in admitted if o.first is not None]
    p50, p99 = fault_load.percentile(ttft, 50), fault_load.percentile(ttft, 99)
    statuses = {}
    for o in refused:
        statuses[o.status] = statuses.get(o.status, 0) + 1
    print(f"{label}: admitted {len(admitted)} ({len(admitted) / OVERLOAD_S:.1f}/s), refused {statuses}; "
          f"admitted TTFT p50 {p50 * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms (bound {TTFT_BOUND_S:.0f} s, "
          f"ratio {p99 / TTFT_BOUND_S:.3f})", flush=True)
    for p in pids:
        growth = peaks[p] - baseline[p]
        print(f"{label}: pid {p} RSS {baseline[p] >> 20} MiB before, peak {peaks[p] >> 20} MiB "
              f"(growth {growth / 2**20:.1f} MiB, bound {RSS_GROWTH_BOUND >> 20} MiB, "
              f"ratio {growth / RSS_GROWTH_BOUND:.3f})", flush=True)
    others = [o.error for o in outcomes if o.kind not in ("ok", "refused")][:5]
    assert not hung, f"{len(hung)} client threads hung"
    assert kinds.get("error", 0) == 0 and kinds.get("truncated", 0) == 0, others
    assert admitted and refused, kinds  # it was overloaded, and it still served
    bad = [(o.status, o.retry_after, o.error) for o in refused if o.status not in (429, 503) or not o.retry_after]
    assert not bad, bad[:5]
    assert p99 < TTFT_BOUND_S, (p50, p99)
    for p in pids:
        assert fault_load.rss_bytes(p) > 0, f"pid {p} died"
        assert peaks[p] - baseline[p] < RSS_GROWTH_BOUND, (p, baseline[p], peaks[p])
    assert fault_load.one_stream(client, prompt_fn(0), MAX_TOKENS, 60).kind == "ok"  # still serving


def test_overload_of_kvmesh_serve_refuses_the_excess_and_keeps_admitted_ttft():
    serve = Proc([KVMESH, "serve", "--host", "127.0.0.1", "--port", "0", "--kv-cache-bytes", str(256 << 20),
                  f"--max_inflight_requests={CAPACITY}", "--grpc_port=-1"],
                 r"listening on (http://127\.0\.0\.1:\d+)")
    try:
        _overload(serve.url, [serve.proc.pid], "kvmesh serve")
    finally:
        assert serve.stop() == 0, "".join(serve.log[-30:])


@pytest.mark.skipif(not SCHEDULER, reason="KVMESH_SCHEDULER_BIN not set")
def test_overload_of_the_cluster_router_refuses_the_excess_and_keeps_admitted_ttft():
    cluster = fault_load.DevCluster("--prefill-workers", "1", "--decode-workers", "1",
                                    env={"KVMESH_BIN": KVMESH, "KVMESH_SCHEDULER_BIN": SCHEDULER})
    router = None
    try:
        # A router of our own in front of the dev cluster's scheduler, with the capacity
        # under test (tools/dev-cluster starts its router with the defaults).
        router = Proc([KVMESH, "router", "--host=127.0.0.1", "--port=0", "--grpc-port=-1",
                       f"--scheduler={cluster.proc('scheduler')['address']}", f"--max_inflight_requests={CAPACITY}"],
                      r"router listening on (http://\S+)")
        pids = [router.proc.pid] + [cluster.proc(n)["pid"] for n in cluster.workers()]
        _overload(router.url, pids, "router")
    finally:
        if router is not None:
            assert router.stop() == 0, "".join(router.log[-30:])
        cluster.stop()
