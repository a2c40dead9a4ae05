"""Faults of the cluster KV store under load (issue #33): a real cluster on 127.0.0.1
(tools/dev-cluster: scheduler, two decode workers that prefill for themselves, two
kvmesh-kv-stores, the router; the scheduler forced to round robin, as tools/bench-kv-store
does, so a prefix computed on one worker is loaded from its home store on the other)
under a continuous streaming load of greedy requests whose prompts share prefixes, and
one fault per phase, in this order on the same cluster:

  a   store-0 SIGKILLed with loads in flight on it (it is stopped first and killed only
      while a worker's load is still in flight, which then can only be frozen on it):
      the loads fail (kvmesh_kv_tier_read_failures{tier="store"}) and are recomputed
  e   store-0 still dead: store-1's share still hits (its hit and get counters rise) and
      workers still load blocks from it
  c   store-0 restarted on the same address (a new epoch): every worker notices the new
      epoch (kvmesh_kv_tier_peer_restarts{tier="store"}: a worker that ignored epochs
      shows 0) and the restarted store is given puts again
  b   store-1 SIGSTOPped past its read lease and the workers' lookup deadline, then
      SIGCONTed: no request fails, none waits much past the load deadline, the stopped
      store's leases end by themselves
  d   decode-1 SIGKILLed while one of its puts is open on a store (it is stopped first
      and killed only while the stores hold an intent, which only it can own then): the
      intents expire (kvmesh_kv_store_intents back to 0, _expired_intents up by as many):
      they were dropped, not committed, so no Get can ever return what they held

After every phase: 0 failed, hung or truncated requests, and every live worker back to
0 KV blocks used, stranded and quarantined, the router 0 in flight. At the end (a last
test) every prompt the load sent is run again on a second cluster without stores and
without faults (one decode worker): every output must be identical, token for token.

Bounded: every request has a client timeout, every wait a deadline; 75 to 135 s on two
cores (under four minutes if every bounded search ran to its end). Prints (pytest
-s) each phase's counts and the counters it checked.
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

httpx = pytest.importorskip("httpx")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fault_load import DevCluster  # noqa: E402

MODEL = "tiny-llama"
MAX_TOKENS = 8
REQUEST_TIMEOUT_S = 60
SYSTEM_TOKENS = 160      # a family's shared prefix: 10 blocks of 16 tokens
USER_TOKENS = 12
TURNS = 3                # requests per family, each with its own user turn
WINDOW = 4               # families interleaved, so a family's next turn comes once its last saved
CONCURRENCY = 3
LEASE_MS = 2000          # the stores' read lease (--lease_ms), shortened so phase b waits past it
INTENT_TIMEOUT_MS = 3000  # the stores' --intent_timeout_ms, shortened so phase d sees expiry soon
LOAD_TIMEOUT_MS = 2000   # the workers' --kv-store-load-timeout-ms (its default)
STORE_ARGS = [f"--lease_ms={LEASE_MS}", f"--max_lease_ms={LEASE_MS}", f"--intent_timeout_ms={INTENT_TIMEOUT_MS}"]

SENT = {}     # (family, turn) -> the output under faults, for the reference test
REPORT = []


def prompt(family, turn):
    rng = random.Random(family)
    system = [rng.randrange(100, 31900) for _ in range(SYSTEM_TOKENS)]
    rng = random.Random(family * 1000 + turn + 1)
    return system + [rng.randrange(100, 31900) for _ in range(USER_TOKENS)]


def complete(client, url, ids):
    """One greedy streaming completion of token ids: (kind, text, seconds); kind is ok,
    failed (an HTTP or stream error), hung (the client timeout) or truncated (no finish)."""
    body = {"model": MODEL, "prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": True}
    start = time.monotonic()
    text, finish = "", None
    try:
        with client.stream("POST", url + "/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S) as r:
            if r.status_code != 200:
                return "failed", f"HTTP {r.status_code}: {r.read().decode(errors='replace')[:200]}", 0
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return "failed", str(chunk["error"])[:200], time.monotonic() - start
                for choice in chunk.get("choices", []):
                    text += choice.get("text") or ""
                    finish = choice.get("finish_reason") or finish
    except httpx.TimeoutException as e:
        return "hung", repr(e), time.monotonic() - start
    except httpx.HTTPError as e:
        return "failed", f"{type(e).__name__}: {e}", time.monotonic() - start
    return ("ok" if finish in ("length", "stop") else "truncated"), text, time.monotonic() - start


class Load:
    """CONCURRENCY threads sending the families from `first_family` on, WINDOW families at
    a time: turn 0 of each, then turn 1 of each, ... (round robin spreads a family's turns
    over both workers, so later turns load the prefix an earlier one saved)."""

    def __init__(self, url, first_family):
        self.url, self.first = url, first_family
        self.results = []  # (family, turn, kind, text, seconds, started)
        self._lock = threading.Lock()
        self._next = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(CONCURRENCY)]

    def _item(self, i):
        window, r = divmod(i, WINDOW * TURNS)
        return self.first + window * WINDOW + r % WINDOW, r // WINDOW

    def _run(self):
        with httpx.Client() as client:
            while not self._stop.is_set():
                with self._lock:
                    family, turn = self._item(self._next)
                    self._next += 1
                started = time.monotonic()
                kind, text, seconds = complete(client, self.url, prompt(family, turn))
                with self._lock:
                    self.results.append((family, turn, kind, text, seconds, started))

    def start(self):
        for t in self._threads:
            t.start()
        return self

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join(REQUEST_TIMEOUT_S + 10)
        assert not any(t.is_alive() for t in self._threads), "a load thread hung past the request timeout"
        return self.results


def scrape(url):
    """{'name{labels}': value} of a /metrics page."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        out = {}
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out


class Cluster:
    def __init__(self):
        self.dev = DevCluster("--prefill-workers", "0", "--decode-workers", "2", "--worker-threads", "1",
                              "--placement-strategy", "round-robin",
                              "--kv-stores", "2", f"--kv-store-bytes={256 << 20}",
                              f"--kv-store-block-bytes={256 << 10}",
                              f"--kv-host-cache-bytes={128 << 20}", f"--kv-cache-bytes={128 << 20}",
                              *[f"--kv-store-arg={a}" for a in STORE_ARGS])
        self.url = self.dev.url
        self.dead = set()
        self.next_family = 0

    def proc(self, name):
        return self.dev.proc(name)

    def workers(self):
        return [n for n in self.dev.workers() if n not in self.dead]

    def worker(self, name, metric):
        return scrape(self.proc(name)["metrics_url"]).get(f'{metric}{{tier="store"}}', 0.0)

    def workers_sum(self, metric):
        return sum(self.worker(n, metric) for n in self.workers())

    def store(self, name, metric=None):
        s = scrape(self.proc(name)["metrics_url"])
        return s if metric is None else s.get(metric, 0.0)

    def run(self, label, fault, seconds_after=3.0):
        """A load; `fault()` once the load runs; the load goes on `seconds_after`; then every
        request must have completed and every live worker settle back to 0 blocks."""
        load = Load(self.url, self.next_family).start()
        try:
            time.sleep(1.0)
            facts = fault() or {}
            time.sleep(seconds_after)
        finally:
            results = load.stop()
        self.next_family += 10_000
        kinds = {}
        for family, turn, kind, text, seconds, _ in results:
            kinds[kind] = kinds.get(kind, 0) + 1
            SENT[(family, turn)] = (label, kind, text)
        slowest = max((r[4] for r in results), default=0)
        settled = self.settled()
        row = f"{label}: {len(results)} requests {json.dumps(kinds)}, slowest {slowest:.2f} s; {json.dumps(facts)}; " \
              f"after it: {json.dumps(settled)}"
        REPORT.append(row)
        print("\n" + row, flush=True)
        bad = [r for r in results if r[2] != "ok"]
        assert not bad, f"{len(bad)} requests did not complete: {bad[:3]}" + self.dev.logs()
        assert len(results) >= CONCURRENCY, "the load sent (almost) nothing"
        for name, values in settled["workers"].items():
            assert values == {"used": 0, "stranded": 0, "quarantined": 0}, f"{name}: {values}" + self.dev.logs()
        assert settled["router_in_flight"] == 0
        return results, facts

    def settled(self, timeout_s=30):
        """Waits until every live worker holds no KV block and the router nothing."""
        deadline = time.time() + timeout_s
        while True:
            workers = {}
            for name in self.workers():
                s = scrape(self.proc(name)["metrics_url"])
                workers[name] = {"used": s.get('kvmesh_kv_blocks{state="used"}'),
                                 "stranded": s.get("kvmesh_kv_blocks_stranded"),
                                 "quarantined": s.get("kvmesh_kv_blocks_quarantined")}
            inflight = scrape(self.url).get("kvmesh_router_requests_inflight")
            done = all(v == {"used": 0, "stranded": 0, "quarantined": 0} for v in workers.values()) and inflight == 0
            if done or time.time() > deadline:
                return {"workers": workers, "router_in_flight": inflight}
            time.sleep(0.2)

    def restart_store(self, name):
        """Starts store `name` again on its address (it must be dead): a new process, a new
        epoch, the same flags. Updates the dev-cluster's state so that `stop` stops it."""
        p = self.proc(name)
        argv = [a if not a.startswith("--listen=") else f"--listen={p['address']}" for a in p["argv"]]
        log = os.path.join(self.dev.run_dir, f"{name}.restarted.log")
        deadline = time.time() + 30
        while True:
            m = None
            with open(log, "w") as f:
                proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
            while time.time() < deadline and proc.poll() is None:
                with open(log, errors="replace") as f:
                    m = re.search(r"kv-store metrics on (http://\S+)/metrics", f.read())
                if m:
                    break
                time.sleep(0.05)
            if proc.poll() is None and m:
                break
            proc.kill()
            assert time.time() < deadline, "the store did not start again on its address:\n" + open(log).read()
            time.sleep(0.5)  # the port is not free yet
        p.update(pid=proc.pid, log=log, metrics_url=m.group(1))
        self._save_state()

    def _save_state(self):
        with open(os.path.join(self.dev.run_dir, "cluster.json"), "w") as f:
            json.dump(self.dev.state, f, indent=2)

    def stop(self):
        for name, p in self.dev.state["processes"].items():
            try:
                os.kill(p["pid"], signal.SIGCONT)
            except ProcessLookupError:
                pass
        return self.dev.stop()


def epoch_of(metrics):
    for key in metrics:
        m = re.match(r'kvmesh_kv_store_epoch_info\{epoch="([0-9a-f]+)"\}', key)
        if m:
            return m.group(1)
    return None


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    for name in ("kv-store-0", "kv-store-1"):
        with open(f"/proc/{c.proc(name)['pid']}/cmdline", "rb") as f:
            c.proc(name)["argv"] = [a.decode() for a in f.read().split(b"\0") if a]
        c.proc(name)["first_epoch"] = epoch_of(c.store(name))
    try:
        yield c
    finally:
        print(c.stop().stdout.strip())


def wait_for(what, timeout_s, poll_s=0.005):
    """Polls `what()` until it returns something true (returned) or the time is up (None)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = what()
        if value:
            return value
        time.sleep(poll_s)
    return None


def test_a_store_killed_mid_read_requests_recompute(cluster):
    # Warm up: both stores hold prefixes and the workers load from them.
    cluster.run("warm-up", lambda: None, seconds_after=2.0)
    gets = sum(cluster.store(s, "kvmesh_kv_store_get_blocks") for s in ("kv-store-0", "kv-store-1"))
    assert gets > 0, "no block was read from a store: the load proves nothing"

    def kill_mid_read():
        # When a worker has a load in flight, SIGSTOP freezes store-0 under it; a load
        # from store-1 alone takes milliseconds, so one still in flight (in both of two
        # looks, kvmesh_kv_tier_reads_in_flight) is frozen on store-0, in its Lookup or
        # its Get: kill the store under it then. Otherwise resume it and try again.
        # NOTE: on the tiny model loading a block and recomputing it cost about the same,
        # and when the engine's measurements say recompute, only every 16th hit is loaded
        # (kv_tiers.h): loads can be rare, hence the long search.
        pid = cluster.proc("kv-store-0")["pid"]
        deadline = time.time() + 60
        attempt = 0
        while time.time() < deadline:
            attempt += 1
            failures = cluster.workers_sum("kvmesh_kv_tier_read_failures")
            wait_for(lambda: cluster.workers_sum("kvmesh_kv_tier_reads_in_flight"), timeout_s=2)
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.3)
            reads = cluster.workers_sum("kvmesh_kv_tier_reads_in_flight")
            if reads > 0:
                time.sleep(0.1)
                reads = min(reads, cluster.workers_sum("kvmesh_kv_tier_reads_in_flight"))
            if reads > 0:
                os.kill(pid, signal.SIGKILL)
                killed_at = time.monotonic()
                cluster.dead.add("kv-store-0")
                failed = wait_for(lambda: cluster.workers_sum("kvmesh_kv_tier_read_failures") - failures,
                                  timeout_s=LOAD_TIMEOUT_MS / 1000 + 1, poll_s=0.05)
                return {"attempts": attempt, "loads_in_flight_at_kill": reads, "loads_failed": failed or 0,
                        "failed_after_s": round(time.monotonic() - killed_at, 2)}
            os.kill(pid, signal.SIGCONT)
            time.sleep(random.random() * 0.2)
        os.kill(pid, signal.SIGKILL)
        cluster.dead.add("kv-store-0")
        return {"attempts": attempt, "loads_in_flight_at_kill": 0}

    _, facts = cluster.run("a: store-0 SIGKILL mid-read", kill_mid_read, seconds_after=2.0)
    assert facts["loads_in_flight_at_kill"], "store-0 never had a load in flight to kill it under"
    # The loads in flight failed and were recomputed: no request failed (run checks that)
    # and the outputs are the reference's (the last test).
    assert facts["loads_failed"] > 0, facts


def test_e_with_one_store_dead_the_other_stores_share_still_hits(cluster):
    assert "kv-store-0" in cluster.dead
    def worker_counts():
        out = {"store_hits": cluster.workers_sum("kvmesh_kv_tier_hits"),
               "store_loads": cluster.workers_sum("kvmesh_kv_tier_blocks_onboarded")}
        for decision in ("load", "recompute"):
            out[decision] = sum(scrape(cluster.proc(n)["metrics_url"]).get(
                f'kvmesh_kv_tier_decisions{{decision="{decision}"}}', 0.0) for n in cluster.workers())
        return out

    before = {"store1": cluster.store("kv-store-1"), "workers": worker_counts()}
    def until_store1_loads():
        # Up to 40 s of load, until a worker loaded blocks (store-0 is dead: from store-1).
        wait_for(lambda: cluster.workers_sum("kvmesh_kv_tier_blocks_onboarded") > before["workers"]["store_loads"],
                 timeout_s=40, poll_s=0.2)

    cluster.run("e: store-0 dead", until_store1_loads, seconds_after=3.0)
    store1 = cluster.store("kv-store-1")
    e = {name: store1[f"kvmesh_kv_store_{name}"] - before["store1"][f"kvmesh_kv_store_{name}"]
         for name in ("hit_blocks", "get_blocks")}
    # Store-0 is dead: whatever the workers found in a store or loaded was store-1's.
    e.update({f"worker_{k}": v - before["workers"][k] for k, v in worker_counts().items()})
    REPORT.append(f"e: store-1 while store-0 was dead: {json.dumps(e)}")
    print(REPORT[-1], flush=True)
    # NOTE: a chain is loadable only as its leading run, and blocks are homed one by one:
    # with store-0 dead a chain loads up to its first block homed there, so these are
    # short runs; and on the tiny model recomputing a block usually beats loading it, so
    # most hits are recomputed and every 16th is loaded anyway (kv_tiers.h's reprobe).
    assert e["hit_blocks"] > 0 and e["get_blocks"] > 0, e
    assert e["worker_store_hits"] > 0 and e["worker_store_loads"] > 0, e


def test_c_store_restarted_workers_notice_its_new_epoch(cluster):
    old_epoch = cluster.proc("kv-store-0")["first_epoch"]
    assert old_epoch
    restarts_before = {n: cluster.worker(n, "kvmesh_kv_tier_peer_restarts") for n in cluster.workers()}
    facts = {}

    def restart():
        cluster.restart_store("kv-store-0")
        cluster.dead.discard("kv-store-0")
        facts["store0_epoch"] = epoch_of(cluster.store("kv-store-0"))

    cluster.run("c: store-0 restarted", restart, seconds_after=6.0)
    restarts = {n: cluster.worker(n, "kvmesh_kv_tier_peer_restarts") - restarts_before[n] for n in cluster.workers()}
    store0 = cluster.store("kv-store-0")
    facts.update(peer_restarts_seen=restarts, store0_lookups=store0["kvmesh_kv_store_lookups"],
                 store0_put_blocks=store0["kvmesh_kv_store_put_blocks"],
                 refused_old_epoch=sum(v for k, v in store0.items() if k.startswith("kvmesh_kv_store_requests_total")
                                       and "FAILED_PRECONDITION" in k))
    REPORT.append(f"c: {json.dumps(facts)}")
    print(REPORT[-1], flush=True)
    assert facts["store0_epoch"] and facts["store0_epoch"] != old_epoch
    # Every worker noticed the new epoch (and so forgot what it believed store-0 held):
    # a worker that ignored epochs would count 0 here.
    assert all(v >= 1 for v in restarts.values()), restarts
    assert store0["kvmesh_kv_store_lookups"] > 0, "the workers never came back to the restarted store"
    assert store0["kvmesh_kv_store_put_blocks"] > 0, "the restarted store was never given a block"
    assert store0["kvmesh_kv_store_checksum_failures"] == 0


def test_b_store_stopped_past_its_lease_no_request_fails_or_hangs(cluster):
    facts = {}
    read_failures = cluster.workers_sum("kvmesh_kv_tier_read_failures")

    def stop_and_continue():
        pid = cluster.proc("kv-store-1")["pid"]
        facts["store1_leases_before"] = cluster.store("kv-store-1", "kvmesh_kv_store_leases")
        os.kill(pid, signal.SIGSTOP)
        facts["stopped_at"] = time.monotonic()
        time.sleep(LEASE_MS / 1000 + 1.0)  # past the lease, the lookup and the load deadline
        os.kill(pid, signal.SIGCONT)
        facts["continued_at"] = time.monotonic()

    results, _ = cluster.run("b: store-1 SIGSTOP past its lease", stop_and_continue, seconds_after=3.0)
    # Requests that overlapped the stop waited at most about one lookup + one load deadline
    # more than the others, never until the client's timeout.
    during = [r[4] for r in results if r[5] < facts["continued_at"] and r[5] + r[4] > facts["stopped_at"]]
    others = [r[4] for r in results if r[5] + r[4] < facts["stopped_at"] or r[5] > facts["continued_at"]]
    slowest_during, slowest_other = max(during, default=0), max(others, default=0)
    leases_after = wait_for(lambda: cluster.store("kv-store-1", "kvmesh_kv_store_leases") == 0,
                            timeout_s=2 * LEASE_MS / 1000, poll_s=0.2)
    read_failures = cluster.workers_sum("kvmesh_kv_tier_read_failures") - read_failures
    REPORT.append(f"b: {len(during)} requests overlapped the stop, slowest {slowest_during:.2f} s "
                  f"(others {slowest_other:.2f} s); worker loads failed over to recompute: {read_failures:.0f}; "
                  f"store-1 leases back to 0: {bool(leases_after)}")
    print(REPORT[-1], flush=True)
    assert during, "no request overlapped the stop"
    assert slowest_during < slowest_other + (LOAD_TIMEOUT_MS + 200) / 1000 + 8.0, REPORT[-1]
    assert leases_after, "the stopped store's leases never ended"


def test_d_worker_killed_mid_put_its_intents_expire_and_nothing_is_committed(cluster):
    stores = ("kv-store-0", "kv-store-1")
    before = {s: cluster.store(s) for s in stores}
    facts = {}

    def kill_mid_put():
        victim = "decode-1"
        pid = cluster.proc(victim)["pid"]
        # When a store holds an intent (a put is open), SIGSTOP the victim: stopped, it
        # cannot finish a put of its own, and a moment later every other writer's intents
        # are committed, so intents still on the stores are the victim's: kill it then.
        # Otherwise resume it and try again.
        deadline = time.time() + 30
        attempt = 0
        while time.time() < deadline:
            attempt += 1
            wait_for(lambda: sum(cluster.store(s, "kvmesh_kv_store_intents") for s in stores), timeout_s=2)
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.3)
            intents = sum(cluster.store(s, "kvmesh_kv_store_intents") for s in stores)
            if intents > 0:  # still there a moment later: not a live writer's
                time.sleep(0.1)
                intents = sum(cluster.store(s, "kvmesh_kv_store_intents") for s in stores)
            if intents > 0:
                os.kill(pid, signal.SIGKILL)
                cluster.dead.add(victim)
                facts.update(victim_intents_at_kill=intents, attempts=attempt)
                return
            os.kill(pid, signal.SIGCONT)
            time.sleep(random.random() * 0.2)

    cluster.run("d: decode-1 SIGKILL mid-put", kill_mid_put, seconds_after=INTENT_TIMEOUT_MS / 1000 + 1.0)
    assert facts.get("victim_intents_at_kill"), "decode-1 never had a put open to kill it in"
    expired = wait_for(lambda: sum(cluster.store(s, "kvmesh_kv_store_intents") for s in stores) == 0,
                       timeout_s=INTENT_TIMEOUT_MS / 1000 + 5, poll_s=0.2)
    after = {s: cluster.store(s) for s in stores}
    facts["intents_now"] = sum(after[s]["kvmesh_kv_store_intents"] for s in stores)
    facts["expired_intents"] = sum(after[s]["kvmesh_kv_store_expired_intents"] -
                                   before[s]["kvmesh_kv_store_expired_intents"] for s in stores)
    facts["checksum_failures"] = sum(after[s]["kvmesh_kv_store_checksum_failures"] for s in stores)
    REPORT.append(f"d: {json.dumps(facts)}")
    print(REPORT[-1], flush=True)
    assert expired, "intents outstanding never returned to 0"
    # The victim's intents ended by expiry, uncommitted: half-written blocks never became
    # visible (a store commits a block only once all of it verified).
    assert facts["expired_intents"] >= facts["victim_intents_at_kill"], facts
    assert facts["checksum_failures"] == 0


def test_every_output_under_faults_equals_a_run_without_store_or_faults():
    assert SENT, "no phase ran"
    ref = DevCluster("--prefill-workers", "0", "--decode-workers", "1", "--worker-threads", "1")
    try:
        items = sorted(SENT)
        outputs = {}
        lock = threading.Lock()

        def worker(chunk):
            with httpx.Client() as client:
                for key in chunk:
                    kind, text, _ = complete(client, ref.url, prompt(*key))
                    with lock:
                        outputs[key] = (kind, text)

        threads = [threading.Thread(target=worker, args=(items[i::4],), daemon=True) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(REQUEST_TIMEOUT_S * 4)
    finally:
        ref.stop()
    differ = [(key, SENT[key], outputs.get(key)) for key in items
              if outputs.get(key, (None, None))[0] != "ok" or outputs[key][1] != SENT[key][2]]
    by_phase = {}
    for key in items:
        by_phase[SENT[key][0]] = by_phase.get(SENT[key][0], 0) + 1
    REPORT.append(f"reference: {len(items) - len(differ)}/{len(items)} outputs identical "
                  f"(per phase: {json.dumps(by_phase)})")
    print("\n" + "\n".join(REPORT), flush=True)
    assert not differ, f"{len(differ)} outputs differ from the reference, e.g. {differ[:3]}"
