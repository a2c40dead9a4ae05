"""Shared by the fault tests (control_plane_test, overload_test, netem_test): a
tools/dev-cluster on 127.0.0.1, a concurrent streaming load over the real `openai`
client that classifies how each request ended, and the kvmesh protos for grpcio."""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
DEV_CLUSTER = os.path.join(HERE, "..", "..", "tools", "dev-cluster")
PROTO_DIR = os.environ.get("KVMESH_PROTO_DIR", os.path.join(HERE, "..", "..", "proto"))
MODEL = "tiny-llama"

_STUBS = []


def stubs():
    """(grpc, scheduler_pb2, scheduler_pb2_grpc, worker_pb2, worker_pb2_grpc), generated once."""
    if not _STUBS:
        import grpc
        import grpc_tools.protoc as protoc
        sys.path.insert(0, HERE)
        import grpc_stubs
        mods = grpc_stubs.load(protoc, PROTO_DIR,
                               ["kvmesh/v1/common.proto", "kvmesh/v1/scheduler.proto", "kvmesh/v1/worker.proto"],
                               ["kvmesh.v1.scheduler_pb2", "kvmesh.v1.scheduler_pb2_grpc", "kvmesh.v1.worker_pb2",
                                "kvmesh.v1.worker_pb2_grpc"])
        _STUBS.append((grpc, *mods[:4]))
    return _STUBS[0]


class DevCluster:
    """tools/dev-cluster start ... / stop, with the state it printed."""

    def __init__(self, *args, env=None):
        self.run_dir = tempfile.mkdtemp(prefix="kvmesh-faults-")
        self.env = dict(os.environ, **(env or {}))
        out = subprocess.run([sys.executable, DEV_CLUSTER, "start", "--run-dir", self.run_dir, *args],
                             capture_output=True, text=True, env=self.env, timeout=300)
        assert out.returncode == 0, out.stderr + self.logs()
        self.state = json.loads(out.stdout)
        self.url = self.state["processes"]["router"]["url"]

    def proc(self, name):
        return self.state["processes"][name]

    def workers(self):
        return [n for n, p in self.state["processes"].items() if "role" in p]

    def logs(self, tail=3000):
        text = ""
        for name in sorted(os.listdir(self.run_dir)):
            if name.endswith(".log"):
                with open(os.path.join(self.run_dir, name), errors="replace") as f:
                    text += f"\n--- {name} ---\n" + f.read()[-tail:]
        return text

    def stop(self):
        return subprocess.run([sys.executable, DEV_CLUSTER, "stop", "--run-dir", self.run_dir],
                              capture_output=True, text=True, env=self.env, timeout=180)


def metric(url, name, labels=""):
    """A sample of a Prometheus text page; 0 when absent."""
    import re
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(r"^" + re.escape(name + labels) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


class Outcome:
    __slots__ = ("start", "first", "end", "kind", "status", "retry_after", "error", "tokens")

    def __init__(self, start):
        self.start, self.first, self.end = start, None, None
        self.kind, self.status, self.retry_after, self.error, self.tokens = None, None, None, "", 0


def one_stream(client, prompt, max_tokens, timeout_s):
    """One streaming completion; returns its Outcome. kind: "ok" (every token, a finish
    reason), "refused" (an HTTP error with a status: 429/503/4xx), "error" (a clear error
    otherwise: a connection error, an error event mid-stream), "truncated" (the stream
    ended without a finish reason)."""
    import openai
    o = Outcome(time.monotonic())
    finish = None
    try:
        stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                           stream=True, timeout=timeout_s, extra_body={"ignore_eos": True})
        for chunk in stream:
            for c in chunk.choices:
                if c.text:
                    if o.first is None:
                        o.first = time.monotonic()
                    o.tokens += 1
                if c.finish_reason:
                    finish = c.finish_reason
        o.kind = "ok" if finish in ("length", "stop") else "truncated"
    except openai.APIStatusError as e:
        o.kind, o.status = "refused", e.status_code
        o.retry_after = e.response.headers.get("retry-after")
        o.error = str(e)[:300]
    except Exception as e:  # noqa: BLE001 - every other ending is classified, not raised
        o.kind, o.error = "error", f"{type(e).__name__}: {str(e)[:300]}"
    o.end = time.monotonic()
    return o


class StreamLoad:
    """`concurrency` threads, each sending streaming completions back to back (the
    prompt from `prompt_fn(i)`) until stop(); every ending recorded."""

    def __init__(self, url, concurrency, prompt_fn, max_tokens=8, timeout_s=60, api_key="none", pause_s=0.0,
                 refused_pause_s=0.0):
        import openai
        self.client = openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0)
        self.outcomes = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._count = 0
        self._refused_pause_s = refused_pause_s
        self._threads = [threading.Thread(target=self._run, args=(prompt_fn, max_tokens, timeout_s, pause_s),
                                          daemon=True) for _ in range(concurrency)]

    def start(self):
        for t in self._threads:
            t.start()
        return self

    def _run(self, prompt_fn, max_tokens, timeout_s, pause_s):
        while not self._stop.is_set():
            with self._lock:
                i = self._count
                self._count += 1
            o = one_stream(self.client, prompt_fn(i), max_tokens, timeout_s)
            with self._lock:
                self.outcomes.append(o)
            if o.kind in ("refused", "error") and self._refused_pause_s:
                time.sleep(self._refused_pause_s)  # a client backing off, if less than Retry-After
            elif pause_s:
                time.sleep(pause_s)

    def stop(self, join_timeout_s=120):
        self._stop.set()
        for t in self._threads:
            t.join(join_timeout_s)
        return [t for t in self._threads if t.is_alive()]  # hung threads


def summarize(outcomes, label):
    kinds = {}
    for o in outcomes:
        kinds[o.kind] = kinds.get(o.kind, 0) + 1
    n = max(1, len(outcomes))
    shares = ", ".join(f"{k} {v} ({100.0 * v / n:.1f}%)" for k, v in sorted(kinds.items()))
    print(f"{label}: {len(outcomes)} requests: {shares}", flush=True)
    errors = {}
    for o in outcomes:
        if o.kind in ("error", "refused"):
            key = o.error[:160]
            errors[key] = errors.get(key, 0) + 1
    for message, count in sorted(errors.items(), key=lambda kv: -kv[1])[:3]:
        print(f"  {count} x {message}", flush=True)
    return kinds


def rss_bytes(pid):
    """Resident set of a process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class RssSampler:
    """Samples the RSS of `pids` every `interval_s` on a thread; peak() per pid."""

    def __init__(self, pids, interval_s=0.25):
        self.pids = list(pids)
        self.samples = {p: [] for p in self.pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)

    def start(self):
        self._thread.start()
        return self

    def _run(self, interval_s):
        while not self._stop.is_set():
            for p in self.pids:
                self.samples[p].append(rss_bytes(p))
            time.sleep(interval_s)

    def stop(self):
        self._stop.set()
        self._thread.join()
        return {p: max(v or [0]) for p, v in self.samples.items()}


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    k = min(len(values) - 1, max(0, int(round(p / 100.0 * (len(values) - 1)))))
    return values[k]
