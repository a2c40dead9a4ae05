"""`kvmesh serve` as users run it: a real server process on 127.0.0.1, driven by
the official `openai` client and by raw HTTP for the bad-input cases."""

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time

import pytest

KVMESH = os.environ["KVMESH_BIN"]
MODELS = os.environ["KVMESH_MODELS_DIR"]
TINY = os.path.join(MODELS, "tiny-llama")


class Server:
    def __init__(self, *extra):
        self.proc = subprocess.Popen(
            [KVMESH, "serve", "--host", "127.0.0.1", "--port", "0", "--kv-cache-bytes", str(256 << 20), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.log = []
        self.port = None
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        assert self.port, "server did not start:\n" + "".join(self.log)
        # Keep draining the log so the server never blocks on a full pipe.
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()

    def _drain(self):
        for line in self.proc.stdout:
            self.log.append(line)

    def url(self):
        return f"http://127.0.0.1:{self.port}/v1"

    def request(self, method, path, body=None, headers=None, timeout=60):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, type(None))) else body.encode("utf-8")
        conn.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
        resp = conn.getresponse()
        payload = resp.read()
        conn.close()
        return resp.status, dict(resp.getheaders()), payload

    def metric(self, name, labels=""):
        status, _, body = self.request("GET", "/metrics")
        assert status == 200
        for line in body.decode().splitlines():
            if line.startswith(name + labels + " ") or (not labels and line.startswith(name + " ")):
                return float(line.split()[-1])
        return None

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        return self.proc.returncode


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    assert s.stop() == 0, "".join(s.log[-30:])


@pytest.fixture(scope="module")
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url(), api_key="unused")


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny-llama"]


def test_completion(client):
    r = client.completions.create(model="tiny-llama", prompt="The quick brown fox", max_tokens=12,
                                  temperature=0, extra_body={"ignore_eos": True})
    assert r.object == "text_completion"
    assert len(r.choices) == 1
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens > 0
    assert isinstance(r.choices[0].text, str) and r.choices[0].text


def test_ids_are_unique_and_created_is_the_request_time(client):
    before = int(time.time())
    first = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=2)
    second = client.completions.create(model="tiny-llama", prompt="hi", max_tokens=2)
    after = int(time.time())
    # 128 random bits, not a counter that restarts from 1 with the process.
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", first.id), first.id
    assert re.fullmatch(r"cmpl-[0-9a-f]{32}", second.id), second.id
    assert first.id[len("chatcmpl-"):] != second.id[len("cmpl-"):]
    for r in (first, second):
        assert before <= r.created <= after, (r.created, before, after)


def test_greedy_completion_matches_the_cli(client):
    prompt = "Paged attention stores keys and values"
    r = client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=20, temperature=0,
                                  extra_body={"ignore_eos": True})
    cli = subprocess.run([KVMESH, "generate", "--prompt", prompt, "--max-tokens", "20", "--temperature", "0",
                          "--ignore-eos", "--json"], capture_output=True, text=True, check=True)
    text = "".join(json.loads(l)["text"] for l in cli.stdout.splitlines() if l.strip())
    assert r.choices[0].text == text


def test_streaming_completion_concatenates_to_the_full_text(client):
    kwargs = dict(model="tiny-llama", prompt="Once upon a time", max_tokens=24, temperature=0,
                  extra_body={"ignore_eos": True})
    full = client.completions.create(**kwargs).choices[0].text
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 24
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]


def test_chat_completion_and_stream(client):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello!"}]
    r = client.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=10, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    content = r.choices[0].message.content
    stream = client.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=10, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == content


def test_n_samples_and_seed(client):
    kwargs = dict(model="tiny-llama", prompt="In the beginning", max_tokens=16, temperature=1.0, n=3, seed=11,
                  extra_body={"ignore_eos": True})
    a = client.completions.create(**kwargs)
    b = client.completions.create(**kwargs)
    assert sorted(c.index for c in a.choices) == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len({c.text for c in a.choices}) > 1
    assert a.usage.completion_tokens == 48


def test_stop_string_cuts_the_text(client):
    base = client.completions.create(model="tiny-llama", prompt="Hello", max_tokens=30, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    assert len(base) > 6
    stop = base[3:6]
    r = client.completions.create(model="tiny-llama", prompt="Hello", max_tokens=30, temperature=0, stop=[stop],
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == base[:base.index(stop)]


def test_logprobs(client):
    r = client.completions.create(model="tiny-llama", prompt="Hello", max_tokens=5, temperature=0, logprobs=3,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.token_logprobs) == 5
    assert all(v <= 0 for v in lp.token_logprobs)
    assert all(len(t) == 3 for t in lp.top_logprobs)


def test_health_and_metrics_pass_promtool(server):
    status, _, body = server.request("GET", "/health")
    assert status == 200
    status, headers, body = server.request("GET", "/metrics")
    assert status == 200
    assert "text/plain" in headers.get("Content-Type", "")
    text = body.decode()
    for name in ("kvmesh_time_to_first_token_seconds", "kvmesh_inter_token_latency_seconds",
                 "kvmesh_e2e_request_latency_seconds", "kvmesh_prompt_tokens_total",
                 "kvmesh_generation_tokens_total", "kvmesh_kv_blocks", "kvmesh_num_requests_running",
                 "kvmesh_prefix_cache_hits", "kvmesh_num_preemptions"):
        assert name in text, name
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (tools/setup installs Debian's prometheus package)")
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.strip() == "" and check.stderr.strip() == "", check.stdout + check.stderr


def test_request_metrics_match_the_requests(server):
    """The per-request histograms and success counter move by exactly what was served."""
    names = ["kvmesh_request_prompt_tokens", "kvmesh_request_generation_tokens", "kvmesh_request_queue_time_seconds",
             "kvmesh_request_prefill_time_seconds", "kvmesh_request_decode_time_seconds",
             "kvmesh_e2e_request_latency_seconds"]

    def snapshot():
        out = {}
        for name in names:
            out[name] = (server.metric(name + "_count") or 0.0, server.metric(name + "_sum") or 0.0)
        out["length"] = server.metric("kvmesh_request_success_total", '{finished_reason="length"}') or 0.0
        return out

    before = snapshot()
    prompt_tokens = 0
    k, max_tokens = 3, 5
    for i in range(k):
        status, _, body = server.request("POST", "/v1/completions", json.dumps(
            {"model": "tiny-llama", "prompt": "metrics " * (i + 2), "max_tokens": max_tokens, "ignore_eos": True}))
        assert status == 200, body
        usage = json.loads(body)["usage"]
        assert usage["completion_tokens"] == max_tokens
        prompt_tokens += usage["prompt_tokens"]
    after = snapshot()
    delta = {name: (after[name][0] - before[name][0], after[name][1] - before[name][1]) for name in names}
    for name in names:
        assert delta[name][0] == k, (name, delta[name])
    assert delta["kvmesh_request_prompt_tokens"][1] == prompt_tokens
    assert delta["kvmesh_request_generation_tokens"][1] == k * max_tokens
    assert after["length"] - before["length"] == k
    assert delta["kvmesh_request_decode_time_seconds"][1] > 0  # 4 decode steps per request
    # The engine's phases lie inside what the front door timed.
    phases = sum(delta[name][1] for name in names[2:5])
    assert phases <= delta["kvmesh_e2e_request_latency_seconds"][1] + 1e-6, delta


BAD_REQUESTS = [
    # (path, body, expected status, expected param or None)
    ("/v1/completions", "{not json", 400, None),
    ("/v1/completions", "[1, 2]", 400, None),
    ("/v1/completions", '"just a string"', 400, None),
    ("/v1/completions", json.dumps({"model": "tiny-llama"}), 400, "prompt"),
    ("/v1/completions", json.dumps({"model": "nope", "prompt": "x"}), 404, "model"),
    ("/v1/completions", json.dumps({"prompt": ""}), 400, "prompt"),
    ("/v1/completions", json.dumps({"prompt": 12}), 400, "prompt"),
    ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": -1}), 400, "max_tokens"),
    ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": 0}), 400, "max_tokens"),
    ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": 10 ** 9}), 400, None),
    ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": "5"}), 400, "max_tokens"),
    ("/v1/completions", json.dumps({"prompt": "x", "temperature": -1}), 400, "temperature"),
    ("/v1/completions", json.dumps({"prompt": "x", "top_p": 1.5}), 400, "top_p"),
    ("/v1/completions", json.dumps({"prompt": "x", "top_k": -5}), 400, "top_k"),
    ("/v1/completions", json.dumps({"prompt": "x", "n": 0}), 400, "n"),
    ("/v1/completions", json.dumps({"prompt": "x", "stop": 5}), 400, "stop"),
    ("/v1/completions", json.dumps({"prompt": "x", "logprobs": 50}), 400, "logprobs"),
    ("/v1/completions", json.dumps({"prompt": "x", "presence_penalty": 3}), 400, "presence_penalty"),
    ("/v1/completions", json.dumps({"prompt": "x", "stream": "yes"}), 400, "stream"),
    ("/v1/completions", json.dumps({"prompt": "word " * 9000, "max_tokens": 4}), 400, None),
    ("/v1/completions", json.dumps({"prompt": [10 ** 7], "max_tokens": 4}), 400, None),
    ("/v1/completions", b'{"prompt": "\xff\xfe bad utf8"}', 400, None),
    # Admission limits (defaults: 256 prompts, stop strings of at most 256 bytes).
    ("/v1/completions", json.dumps({"prompt": ["x"] * 257, "max_tokens": 1}), 400, "prompt"),
    ("/v1/completions", json.dumps({"prompt": "x", "stop": ["y" * 257]}), 400, "stop[0]"),
    ("/v1/completions", json.dumps({"prompt": ["x"] * 3, "n": 100}), 400, "n"),
    ("/v1/chat/completions", json.dumps({"model": "tiny-llama"}), 400, "messages"),
    ("/v1/chat/completions", json.dumps({"messages": []}), 400, "messages"),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user"}]}), 400, None),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}), 400, None),
    ("/v1/chat/completions", json.dumps({"messages": "hi"}), 400, "messages"),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 5}), 400,
     None),
]


@pytest.mark.parametrize("path,body,status,param", BAD_REQUESTS)
def test_bad_input_gets_openai_error_json(server, path, body, status, param):
    got, _, payload = server.request("POST", path, body)
    assert got == status, payload
    err = json.loads(payload)["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["type"]
    if param is not None:
        assert err["param"] == param, err


def test_unknown_path_and_oversized_body(server):
    status, _, payload = server.request("GET", "/v1/nothing")
    assert status == 404 and "error" in json.loads(payload)
    status, _, payload = server.request("POST", "/v1/completions", "x" * (9 << 20))
    assert status == 413 and "error" in json.loads(payload)
    status, _, _ = server.request("GET", "/health")
    assert status == 200  # still serving


def test_client_disconnect_mid_stream_frees_every_kv_block(server):
    body = json.dumps({"prompt": "Tell me a long story", "max_tokens": 4000, "temperature": 0, "stream": True,
                       "ignore_eos": True})
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    received = b""
    while received.count(b"data: ") < 5:
        received += sock.recv(65536)
    assert server.metric("kvmesh_kv_blocks", '{state="used"}') > 0
    sock.close()
    deadline = time.time() + 30
    while time.time() < deadline and server.metric("kvmesh_kv_blocks", '{state="used"}') != 0:
        time.sleep(0.05)
    assert server.metric("kvmesh_kv_blocks", '{state="used"}') == 0
    assert server.metric("kvmesh_num_requests_running") == 0


def test_api_keys():
    s = Server("--api-keys", "secret1,secret2")
    try:
        status, _, payload = s.request("GET", "/v1/models")
        assert status == 401 and json.loads(payload)["error"]["type"] == "authentication_error"
        status, _, _ = s.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
        assert status == 401
        status, _, _ = s.request("GET", "/v1/models", headers={"Authorization": "Bearer secret2"})
        assert status == 200
        status, _, _ = s.request("GET", "/health")
        assert status == 200  # probes need no key
    finally:
        assert s.stop() == 0


def test_sigterm_drains_running_requests():
    # Generous: ctest runs other servers beside this one, and on a loaded 2-core machine
    # the request's tokens may take minutes. It streams, so that a socket timeout can only
    # mean a stalled server, not a slow one.
    s = Server("--drain-timeout-ms", "600000")
    result = {}

    def run():
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        conn.request("POST", "/v1/completions",
                     body=json.dumps({"prompt": "x", "max_tokens": 300, "temperature": 0, "ignore_eos": True,
                                      "stream": True, "stream_options": {"include_usage": True}}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        usage, done = None, False
        for line in resp:  # server-sent events, one "data: ..." line each
            line = line.decode().strip()
            if line == "data: [DONE]":
                done = True
                break
            if line.startswith("data: "):
                usage = json.loads(line[len("data: "):]).get("usage") or usage
        conn.close()
        result["resp"] = (resp.status, done, usage)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.time() + 30
    while time.time() < deadline and not s.metric("kvmesh_num_requests_running"):
        time.sleep(0.01)
    s.proc.terminate()
    # While the running request finishes, probes see 503 and new requests are refused.
    deadline = time.time() + 10
    health = None
    while time.time() < deadline and t.is_alive():
        health, _, _ = s.request("GET", "/health")
        if health == 503:
            break
        time.sleep(0.01)
    if t.is_alive():
        assert health == 503
        refused, headers, body = s.request("POST", "/v1/completions", json.dumps({"prompt": "y", "max_tokens": 2}))
        assert refused == 503 and headers.get("Retry-After") == "1", body
        assert json.loads(body)["error"]["code"] == "draining"
    t.join(timeout=600)
    status, done, usage = result["resp"]
    assert status == 200 and done, "".join(s.log)
    assert usage["completion_tokens"] == 300, usage  # finished, not cut off
    assert s.proc.wait(timeout=60) == 0


def test_64_concurrent_streaming_clients_all_complete(server, client):
    errors = []
    counts = []

    def one(i):
        try:
            n = 0
            for chunk in client.completions.create(model="tiny-llama", prompt=f"Request number {i}", max_tokens=32,
                                                   temperature=0.8, seed=i, stream=True,
                                                   extra_body={"ignore_eos": True}):
                if chunk.choices and chunk.choices[0].text:
                    n += 1
            counts.append(n)
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:3]
    assert len(counts) == 64
    assert all(c > 0 for c in counts)
