"""Network faults between services (#14, "It must show"), with network namespaces, veth
pairs and tc. Every service in its own namespace, every hop over its own link:

    root (the test's openai clients) --ct-- R (scheduler, router) --rp-- P (prefill worker)
                                              \\--rd-- D (decode worker) --pd--/

(router <-> decode and the decode worker's heartbeats on rd; prefill <-> decode, the
Prefill call and the KV push, on pd: static /32 routes send the workers to each other
over it). Under a concurrent streaming load through the router each fault is injected
on one link and taken away again: a cut link (link down) between router and decode
and between prefill and decode, a slow link (tbf rate limit), and, where the kernel
has sch_netem, delay with jitter and packet loss. Packet loss is also injected with
nftables (`numgen random ... drop` on each end's output: real drops in the kernel,
both directions), and delay with jitter by a delaying TCP relay in front of a decode
worker (tcp_delay_relay.py, as toxiproxy does it: every gRPC hop into the decode
worker, the router's streams and the prefill worker's KV push, crosses it), so both
run where the kernel lacks sch_netem too. Every request must end with tokens
or a clear error within END_BOUND_S (the clients' timeout): none hangs or is
truncated; afterwards a request is served and no KV block is left in use on the
decode worker. The shares are printed per fault.

Skipped, saying why, without root or where namespaces cannot be made; the netem cases
skip, saying why, where `tc qdisc ... netem` is unknown to the kernel, and the nftables
case where `nft` cannot make a table."""

import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest

openai = pytest.importorskip("openai")

import fault_load  # noqa: E402

KVMESH = os.environ.get("KVMESH_BIN")
SCHEDULER = os.environ.get("KVMESH_SCHEDULER_BIN")
if not KVMESH or not SCHEDULER:
    pytest.skip("KVMESH_BIN / KVMESH_SCHEDULER_BIN not set", allow_module_level=True)

END_BOUND_S = 90.0  # every request ends within this (the clients' timeout)
CUT_S = 8.0  # shorter than any timeout: the streams stall and resume
TAG = f"kf{os.getpid() % 10000}"
NS = {"r": f"{TAG}r", "p": f"{TAG}p", "d": f"{TAG}d"}
# link: (namespace or None for root, interface, address/24) for each end
LINKS = {
    "ct": ((None, f"{TAG}ct0", "10.201.0.1"), ("r", f"{TAG}ct1", "10.201.0.2")),
    "rp": (("r", f"{TAG}rp0", "10.201.1.1"), ("p", f"{TAG}rp1", "10.201.1.2")),
    "rd": (("r", f"{TAG}rd0", "10.201.2.1"), ("d", f"{TAG}rd1", "10.201.2.2")),
    "pd": (("p", f"{TAG}pd0", "10.201.3.1"), ("d", f"{TAG}pd1", "10.201.3.2")),
}
PREFILL_IP, DECODE_IP, ROUTER_IP = "10.201.1.2", "10.201.2.2", "10.201.0.2"


def _sh(*cmd):
    return subprocess.run(list(cmd), capture_output=True, text=True)


def _ip(ns, *args):
    return _sh("ip", *(["-n", NS[ns]] if ns else []), *args)


def _tc(ns, *args):
    return _sh(*(["ip", "netns", "exec", NS[ns]] if ns else []), "tc", *args)


def _routes():
    # The workers reach each other over pd: decode's address via P's end of pd, and back.
    _ip("p", "route", "replace", f"{DECODE_IP}/32", "via", "10.201.3.2", "dev", LINKS["pd"][0][1])
    _ip("d", "route", "replace", f"{PREFILL_IP}/32", "via", "10.201.3.1", "dev", LINKS["pd"][1][1])


def _teardown():
    for _, ((ns, dev, _), _) in LINKS.items():
        _ip(ns, "link", "del", dev)
    for name in NS.values():
        _sh("ip", "netns", "del", name)


def _make_topology():
    _teardown()
    steps = [("ip", "netns", "add", n) for n in NS.values()]
    for a, b in LINKS.values():
        steps.append(("ip", *(["-n", NS[a[0]]] if a[0] else []), "link", "add", a[1], "type", "veth", "peer", "name",
                      b[1], "netns", NS[b[0]]))
        for ns, dev, addr in (a, b):
            pre = ["-n", NS[ns]] if ns else []
            steps += [("ip", *pre, "addr", "add", f"{addr}/24", "dev", dev), ("ip", *pre, "link", "set", dev, "up")]
    steps += [("ip", "-n", n, "link", "set", "lo", "up") for n in NS.values()]
    for step in steps:
        out = _sh(*step)
        if out.returncode != 0:
            _teardown()
            return f"cannot make the network namespaces here ({' '.join(step)}: {out.stderr.strip()})"
    _routes()
    return None


class NsProc:
    def __init__(self, ns, argv, pattern):
        self.proc = subprocess.Popen(["ip", "netns", "exec", NS[ns], *argv], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.log = []
        self.match = None
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(pattern, line)
            if m:
                self.match = m
                break
        assert self.match, f"{argv[0]} did not start:\n{''.join(self.log)}"
        threading.Thread(target=lambda: [self.log.append(l) for l in self.proc.stdout], daemon=True).start()

    def wait_log(self, pattern, timeout_s=60):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if any(re.search(pattern, l) for l in self.log):
                return
            time.sleep(0.05)
        raise AssertionError(f"no /{pattern}/ in:\n{''.join(self.log[-30:])}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def cluster():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    why = _make_topology()
    if why:
        pytest.skip(why)
    procs = []
    try:
        sched = NsProc("r", [SCHEDULER, "--listen=0.0.0.0:0", "--heartbeat_interval_ms=200", "--worker_ttl_ms=3000",
                             "--disaggregation_threshold_tokens=0"], r"scheduler listening address=\S+:(\d+)")
        procs.append(sched)
        port = sched.match.group(1)
        common = ["--kv-cache-bytes", str(128 << 20), "--threads=1", "--metrics-port=0"]
        prefill = NsProc("p", [KVMESH, "worker", "--role=prefill", f"--listen={PREFILL_IP}:0",
                               f"--scheduler=10.201.1.1:{port}", f"--worker_id={TAG}-prefill",
                               f"--metrics_host={PREFILL_IP}", *common], r"worker listening on (\S+)")
        procs.append(prefill)
        decode = NsProc("d", [KVMESH, "worker", "--role=decode", f"--listen={DECODE_IP}:0",
                              f"--scheduler=10.201.2.1:{port}", f"--worker_id={TAG}-decode",
                              f"--metrics_host={DECODE_IP}", *common], r"worker listening on (\S+)")
        procs.append(decode)
        for w in (prefill, decode):
            w.wait_log(r"registered with the scheduler")
        decode.wait_log(r"worker metrics on http://\S+/metrics")
        metrics_url = re.search(r"worker metrics on (http://\S+)/metrics", "".join(decode.log)).group(1)
        router = NsProc("r", [KVMESH, "router", f"--host={ROUTER_IP}", "--port=0", "--grpc-port=-1",
                              f"--scheduler=127.0.0.1:{port}"], r"router listening on (http://\S+)")
        procs.append(router)
        yield {"url": router.match.group(1), "decode_metrics": metrics_url, "procs": procs, "scheduler_port": port}
    finally:
        for p in reversed(procs):
            p.stop()
        _teardown()


def prompt_fn(i):
    # Long enough to be disaggregated (the threshold is 0): the prefill worker and the KV
    # push take part in every request.
    return f"Request {i}: " + "the quick brown fox jumps over the lazy dog, " * 6


def _under_fault(cluster, name, inject, heal, fault_s=CUT_S):
    load = fault_load.StreamLoad(cluster["url"], concurrency=3, prompt_fn=prompt_fn, max_tokens=12,
                                 timeout_s=END_BOUND_S, refused_pause_s=0.1).start()
    time.sleep(2.0)
    t0 = time.monotonic()
    out = inject()
    try:
        assert out.returncode == 0, out.stderr
        time.sleep(fault_s)
    finally:
        heal()
    t_heal = time.monotonic()
    time.sleep(3.0)
    hung_threads = load.stop(join_timeout_s=END_BOUND_S + 30)
    outcomes = load.outcomes
    during = [o for o in outcomes if o.end >= t0 and o.start <= t_heal]
    kinds = fault_load.summarize(outcomes, f"{name}: all")
    fault_load.summarize(during, f"{name}: overlapping the {fault_s:.0f} s fault")
    longest = max((o.end - o.start for o in outcomes), default=0.0)
    for label, group in (("before and after", [o for o in outcomes if o not in during]), ("during", during)):
        times = sorted(o.end - o.start for o in group if o.kind == "ok")
        if times:
            print(f"{name}: request time median {times[len(times) // 2] * 1000:.0f} ms {label} the fault", flush=True)
    print(f"{name}: longest request {longest:.1f} s (bound {END_BOUND_S:.0f} s, ratio {longest / END_BOUND_S:.3f})",
          flush=True)
    hung = [o for o in outcomes if o.kind == "error" and "Timeout" in o.error]
    unclear = [o for o in outcomes if o.kind == "error" and not o.error]
    errors = [o.error for o in outcomes if o.kind not in ("ok",)][:5]
    assert not hung_threads and not hung, f"{len(hung)} requests hung past {END_BOUND_S} s: {errors}"
    assert kinds.get("truncated", 0) == 0, errors
    assert not unclear
    assert during, "no request overlapped the fault"
    # Healed: served again, and nothing left in use on the decode worker.
    client = openai.OpenAI(base_url=cluster["url"] + "/v1", api_key="none", max_retries=0)
    deadline = time.time() + 30
    last = None
    while time.time() < deadline:
        last = fault_load.one_stream(client, prompt_fn(0), 4, END_BOUND_S)
        if last.kind == "ok":
            break
        time.sleep(0.5)
    assert last.kind == "ok", last.error
    deadline = time.time() + 30
    used = None
    while time.time() < deadline:
        used = _decode_blocks_used(cluster["decode_metrics"])
        if not used:
            break
        time.sleep(0.2)
    assert not used, f"{used} KV blocks left in use on the decode worker"
    return kinds


def _decode_blocks_used(metrics_url):
    # The decode worker's /metrics is reachable from its own namespace only.
    out = _sh("ip", "netns", "exec", NS["d"], "python3", "-c",
              "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())",
              metrics_url + "/metrics")
    assert out.returncode == 0, out.stderr
    m = re.search(r'^kvmesh_kv_blocks\{state="used"\} (\S+)$', out.stdout, re.M)
    assert m, out.stdout[-2000:]
    return float(m.group(1))


def _link(link, up):
    ns, dev, _ = LINKS[link][0]
    out = _ip(ns, "link", "set", dev, "up" if up else "down")
    if up:
        ns1, dev1, _ = LINKS[link][1]
        _ip(ns1, "link", "set", dev1, "up")
        _routes()  # the /32 routes over pd went with the link
    return out


def test_cut_link_between_router_and_decode_worker(cluster):
    _under_fault(cluster, "cut router<->decode", lambda: _link("rd", False), lambda: _link("rd", True))


def test_long_cut_between_router_and_decode_worker_ends_every_request(cluster):
    # Down past the decode worker's lease (3 s) and gRPC's keepalive (30 s + 10 s): the
    # streams it held end with an error, new requests find it unreachable; each ends
    # clearly and in time, and it serves again once the link is back.
    kinds = _under_fault(cluster, "long cut router<->decode", lambda: _link("rd", False), lambda: _link("rd", True),
                         fault_s=45.0)
    assert kinds.get("error", 0) + kinds.get("refused", 0) > 0, kinds  # the cut was felt


def test_cut_link_between_prefill_and_decode_workers(cluster):
    _under_fault(cluster, "cut prefill<->decode", lambda: _link("pd", False), lambda: _link("pd", True))


def _qdisc_both_ends(link, *spec):
    a, b = LINKS[link]
    out = _tc(a[0], "qdisc", "replace", "dev", a[1], "root", *spec)
    if out.returncode == 0:
        out = _tc(b[0], "qdisc", "replace", "dev", b[1], "root", *spec)
    return out


def _clear_qdisc(link):
    for ns, dev, _ in LINKS[link]:
        _tc(ns, "qdisc", "del", "dev", dev, "root")


def test_slow_links_rate_limited(cluster):
    # tbf: 2 Mbit/s with a 200 ms queue on both worker links (the KV push crosses pd).
    _under_fault(cluster, "slow links (tbf 2mbit)",
                 lambda: (_qdisc_both_ends("rd", "tbf", "rate", "2mbit", "burst", "32kbit", "latency", "200ms"),
                          _qdisc_both_ends("pd", "tbf", "rate", "2mbit", "burst", "32kbit", "latency", "200ms"))[1],
                 lambda: (_clear_qdisc("rd"), _clear_qdisc("pd")))


def _skip_without_netem():
    out = _qdisc_both_ends("rd", "netem", "delay", "1ms")
    _clear_qdisc("rd")
    if out.returncode != 0:
        pytest.skip(f"tc netem is not available here ({out.stderr.strip()}): the kernel lacks sch_netem")


@pytest.mark.parametrize("spec", [("delay", "50ms", "20ms"), ("loss", "5%"), ("delay", "20ms", "loss", "2%")],
                         ids=["delay", "loss", "delay+loss"])
def test_netem_on_every_worker_link(cluster, spec):
    _skip_without_netem()

    def inject():
        out = _qdisc_both_ends("rd", "netem", *spec)
        return out if out.returncode != 0 else _qdisc_both_ends("pd", "netem", *spec)

    _under_fault(cluster, f"netem {' '.join(spec)}", inject, lambda: (_clear_qdisc("rd"), _clear_qdisc("pd")))


def _nft(ns, script):
    return subprocess.run(["ip", "netns", "exec", NS[ns], "nft", "-f", "-"], input=script, capture_output=True,
                          text=True)


def _nft_loss(link, percent):
    """Drops `percent`% of the packets leaving either end of `link` (both directions)."""
    for ns, dev, _ in LINKS[link]:
        out = _nft(ns, f"""table inet kvfault_{link} {{
  chain out {{
    type filter hook output priority 0; policy accept;
    oifname "{dev}" numgen random mod 100 < {percent} drop
  }}
}}
""")
        if out.returncode != 0:
            return out
    return out


def _clear_nft(link):
    for ns, _, _ in LINKS[link]:
        _sh("ip", "netns", "exec", NS[ns], "nft", "delete", "table", "inet", f"kvfault_{link}")


@pytest.mark.parametrize("percent", [2, 10])
def test_packet_loss_on_every_worker_link_with_nftables(cluster, percent):
    probe = _nft_loss("rd", 0)
    _clear_nft("rd")
    if probe.returncode != 0:
        pytest.skip(f"nftables cannot drop packets here ({probe.stderr.strip()})")

    def inject():
        out = _nft_loss("rd", percent)
        return out if out.returncode != 0 else _nft_loss("pd", percent)

    _under_fault(cluster, f"loss {percent}% (nftables) on router<->decode and prefill<->decode", inject,
                 lambda: (_clear_nft("rd"), _clear_nft("pd")))


def _free_port(ns, ip):
    out = _sh("ip", "netns", "exec", NS[ns], "python3", "-c",
              "import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])", ip)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


@pytest.fixture(scope="module")
def relayed_decode(cluster):
    """Replaces the cluster's decode worker by one behind a delaying relay (the relay
    listens on the address the worker advertises). Module-scoped and requested by the
    last tests of this file only: the cut-link tests above run against the direct one."""
    control = f"/tmp/{TAG}-relay.json"
    with open(control, "w") as f:
        json.dump({"target": None, "delay_ms": 0, "jitter_ms": 0}, f)
    relay = NsProc("d", ["python3", os.path.join(os.path.dirname(__file__), "tcp_delay_relay.py"),
                         f"--listen={DECODE_IP}:0", f"--control={control}"], r"relay listening on \S+:(\d+)")
    cluster["procs"].append(relay)
    old = cluster["procs"][2]
    old.stop()  # drains, then deregisters (and the scheduler's TTL is 3 s)
    port = _free_port("d", DECODE_IP)
    with open(control, "w") as f:
        json.dump({"target": f"{DECODE_IP}:{port}", "delay_ms": 0, "jitter_ms": 0}, f)
    # gRPC KV push (not UCX, which would go to the worker's own address, around the relay).
    decode = NsProc("d", [KVMESH, "worker", "--role=decode", f"--listen={DECODE_IP}:{port}",
                          f"--advertise_address={DECODE_IP}:{relay.match.group(1)}",
                          f"--scheduler=10.201.2.1:{cluster['scheduler_port']}", f"--worker_id={TAG}-decode-relayed",
                          f"--metrics_host={DECODE_IP}", "--kv-transport=grpc", "--kv-cache-bytes", str(128 << 20),
                          "--threads=1", "--metrics-port=0"], r"worker listening on (\S+)")
    cluster["procs"][2] = decode
    decode.wait_log(r"registered with the scheduler")
    decode.wait_log(r"worker metrics on http://\S+/metrics")
    cluster["decode_metrics"] = re.search(r"worker metrics on (http://\S+)/metrics", "".join(decode.log)).group(1)
    time.sleep(4.0)  # the old registration is gone from the scheduler's view

    def set_delay(delay_ms, jitter_ms):
        tmp = control + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"target": f"{DECODE_IP}:{port}", "delay_ms": delay_ms, "jitter_ms": jitter_ms}, f)
        os.replace(tmp, control)
        time.sleep(0.3)  # the relay re-reads it every 100 ms
        return subprocess.CompletedProcess(args=[], returncode=0)

    yield set_delay
    os.unlink(control)


@pytest.mark.parametrize("delay_ms,jitter_ms,loss_percent", [(50, 20, 0), (20, 10, 2)],
                         ids=["delay 50ms jitter 20ms", "delay 20ms + loss 2%"])
def test_delay_with_jitter_into_the_decode_worker_through_a_relay(cluster, relayed_decode, delay_ms, jitter_ms,
                                                                   loss_percent):
    def inject():
        out = relayed_decode(delay_ms, jitter_ms)
        if loss_percent:
            out = _nft_loss("rd", loss_percent)
            if out.returncode == 0:
                out = _nft_loss("pd", loss_percent)
        return out

    def heal():
        relayed_decode(0, 0)
        _clear_nft("rd")
        _clear_nft("pd")

    name = f"delay {delay_ms}ms jitter {jitter_ms}ms" + (f" + loss {loss_percent}%" if loss_percent else "")
    _under_fault(cluster, f"{name} (relay) on router->decode and prefill->decode", inject, heal)
    # The delayed hops really crossed the relay: the router's streams and the prefill
    # worker's KV push.
    relay = cluster["procs"][-1]
    sources = {re.search(r"relay connection from (\S+):", l).group(1) for l in relay.log if "relay connection" in l}
    assert ROUTER_IP in sources or "10.201.2.1" in sources, sources
    assert PREFILL_IP in sources or "10.201.3.1" in sources, sources
