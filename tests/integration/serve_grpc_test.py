"""`kvmesh serve`'s gRPC front door (kvmesh.v1.Inference) as clients use it: one real
server process on 127.0.0.1 with both REST and gRPC ports, driven by grpcio with stubs
generated at test time from proto/ (grpc_tools.protoc), and compared with the REST API
and the CLI."""

import json
import os
import re
import subprocess
import threading
import time
import urllib.request
import urllib.error

import pytest

import grpc_stubs

grpc = pytest.importorskip("grpc")
protoc = pytest.importorskip("grpc_tools.protoc")

KVMESH = os.environ["KVMESH_BIN"]
MODELS = os.environ["KVMESH_MODELS_DIR"]
PROTO_DIR = os.environ.get("KVMESH_PROTO_DIR",
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "proto"))
MODEL = "tiny-llama"
RPC_TIMEOUT_S = 60


pb, pb_grpc, common, health_pb, health_grpc = grpc_stubs.load(
    protoc, PROTO_DIR, ["kvmesh/v1/common.proto", "kvmesh/v1/api.proto"],
    ["kvmesh.v1.api_pb2", "kvmesh.v1.api_pb2_grpc", "kvmesh.v1.common_pb2"])


class Server:
    """`kvmesh serve` with REST and gRPC on ephemeral ports."""

    def __init__(self, *extra):
        self.proc = subprocess.Popen(
            [KVMESH, "serve", "--host", "127.0.0.1", "--port", "0", "--grpc-port", "0",
             "--kv-cache-bytes", str(256 << 20), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.log = []
        self.port = self.grpc_port = None
        deadline = time.time() + 120
        while time.time() < deadline and not (self.port and self.grpc_port):
            line = self.proc.stdout.readline()
            if not line:
                break
            self.log.append(line)
            if m := re.search(r"grpc listening on 127\.0\.0\.1:(\d+)", line):
                self.grpc_port = int(m.group(1))
            if m := re.search(r"listening on http://127\.0\.0\.1:(\d+)", line):
                self.port = int(m.group(1))
        assert self.port and self.grpc_port, "server did not start:\n" + "".join(self.log)
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.stub = pb_grpc.InferenceStub(self.channel)

    def _drain(self):
        for line in self.proc.stdout:
            self.log.append(line)

    def rest(self, path, body=None):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=RPC_TIMEOUT_S) as resp:
            payload = resp.read().decode()
        return json.loads(payload) if path != "/metrics" else payload

    def metric(self, name, labels=""):
        for line in self.rest("/metrics").splitlines():
            if line.startswith(name + labels + " "):
                return float(line.split()[-1])
        return None

    def stop(self):
        self.channel.close()
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


def sampling(**kw):
    return common.SamplingParams(**kw)


def generate(server, timeout=RPC_TIMEOUT_S, **kw):
    return list(server.stub.Generate(pb.GenerateRequest(**kw), timeout=timeout))


def texts_by_index(responses):
    out = {}
    for r in responses:
        out[r.index] = out.get(r.index, "") + r.text
    return out


def greedy(max_tokens, **kw):
    return sampling(temperature=0, max_tokens=max_tokens, ignore_eos=True, skip_special_tokens=True, **kw)


# ---- Generate ----

def test_streaming_text_prompt(server):
    rs = generate(server, text="The quick brown fox", sampling=greedy(12),
                  stream_options=pb.StreamOptions(include_usage=True))
    assert len(rs) >= 2, "expected a stream of messages"
    assert sum(len(r.token_ids) for r in rs) == 12
    assert all(r.index == 0 for r in rs)
    assert [r.finish_reason for r in rs if r.finish_reason] == [common.FINISH_REASON_LENGTH]
    assert rs[-1].HasField("usage")
    assert rs[-1].usage.completion_tokens == 12
    assert rs[-1].usage.prompt_tokens > 0
    assert rs[-1].usage.total_tokens == rs[-1].usage.prompt_tokens + 12
    assert not any(r.HasField("usage") for r in rs[:-1])
    assert "".join(r.text for r in rs)
    assert len({r.request_id for r in rs}) == 1 and rs[0].request_id


def test_client_request_id_is_echoed(server):
    rs = generate(server, request_id="my-id-1", text="x", sampling=greedy(3))
    assert {r.request_id for r in rs} == {"my-id-1"}


@pytest.mark.parametrize("prompt", ["Paged attention stores keys and values", "Once upon a time"])
def test_greedy_text_equals_rest_completions(server, prompt):
    rs = generate(server, model=MODEL, text=prompt, sampling=greedy(20))
    rest = server.rest("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 20, "temperature": 0,
                                           "ignore_eos": True})
    assert "".join(r.text for r in rs) == rest["choices"][0]["text"]


def test_token_id_prompt_equals_text_prompt(server):
    prompt = "Paged attention stores keys and values"
    ids = server.stub.Tokenize(pb.TokenizeRequest(text=prompt)).token_ids
    by_text = generate(server, text=prompt, sampling=greedy(16))
    by_ids = generate(server, token_ids=pb.TokenIds(ids=list(ids)), sampling=greedy(16))
    assert [t for r in by_ids for t in r.token_ids] == [t for r in by_text for t in r.token_ids]
    assert "".join(r.text for r in by_ids) == "".join(r.text for r in by_text)
    rest = server.rest("/v1/completions", {"prompt": list(ids), "max_tokens": 16, "temperature": 0,
                                           "ignore_eos": True})
    assert "".join(r.text for r in by_ids) == rest["choices"][0]["text"]


def test_chat_prompt_equals_rest_chat(server):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello!"}]
    chat = pb.ChatPrompt(messages=[pb.ChatMessage(**m) for m in messages])
    rs = generate(server, chat=chat, sampling=greedy(10), stream_options=pb.StreamOptions(include_usage=True))
    rest = server.rest("/v1/chat/completions", {"messages": messages, "max_tokens": 10, "temperature": 0,
                                                "ignore_eos": True})
    assert "".join(r.text for r in rs) == rest["choices"][0]["message"]["content"]
    assert rs[-1].usage.prompt_tokens == rest["usage"]["prompt_tokens"]
    tok = server.stub.Tokenize(pb.TokenizeRequest(chat=chat))
    assert tok.count == rest["usage"]["prompt_tokens"]


def test_n_samples_interleave_and_each_finishes(server):
    kw = dict(text="In the beginning",
              sampling=sampling(temperature=1.0, max_tokens=16, n=3, seed=11, ignore_eos=True),
              stream_options=pb.StreamOptions(include_usage=True))
    a = generate(server, **kw)
    b = generate(server, **kw)
    assert {r.index for r in a} == {0, 1, 2}
    for i in range(3):
        mine = [r for r in a if r.index == i]
        assert sum(len(r.token_ids) for r in mine) == 16
        assert [r.finish_reason for r in mine if r.finish_reason] == [common.FINISH_REASON_LENGTH]
        assert mine[-1].finish_reason == common.FINISH_REASON_LENGTH
    ta, tb = texts_by_index(a), texts_by_index(b)
    assert ta == tb  # seeded
    assert len(set(ta.values())) > 1
    assert a[-1].usage.completion_tokens == 48
    # Sample 0 of a seeded n=3 request reproduces the n=1 request with the same seed.
    one = generate(server, text="In the beginning",
                   sampling=sampling(temperature=1.0, max_tokens=16, seed=11, ignore_eos=True))
    assert "".join(r.text for r in one) == ta[0]


def test_stop_string_cuts_the_text(server):
    base = "".join(r.text for r in generate(server, text="Hello", sampling=greedy(30)))
    assert len(base) > 6
    stop = base[3:6]
    rs = generate(server, text="Hello", sampling=greedy(30, stop=[stop]))
    assert "".join(r.text for r in rs) == base[:base.index(stop)]
    assert rs[-1].finish_reason == common.FINISH_REASON_STOP
    assert rs[-1].WhichOneof("stop_reason") == "stop_string" and rs[-1].stop_string == stop
    rest = server.rest("/v1/completions", {"prompt": "Hello", "max_tokens": 30, "temperature": 0,
                                           "ignore_eos": True, "stop": [stop]})
    assert rest["choices"][0]["text"] == base[:base.index(stop)]
    kept = generate(server, text="Hello", sampling=greedy(30, stop=[stop], include_stop_str_in_output=True))
    assert "".join(r.text for r in kept) == base[:base.index(stop) + len(stop)]


def test_stop_token_id_is_reported(server):
    rs = generate(server, text="Hello", sampling=greedy(30))
    ids = [t for r in rs for t in r.token_ids]
    stop_id = ids[4]
    cut = generate(server, text="Hello", sampling=greedy(30, stop_token_ids=[stop_id]))
    got = [t for r in cut for t in r.token_ids]
    assert got == ids[:ids.index(stop_id) + 1]
    assert cut[-1].finish_reason == common.FINISH_REASON_STOP
    assert cut[-1].WhichOneof("stop_reason") == "stop_token_id" and cut[-1].stop_token_id == stop_id


def test_logprobs(server):
    rs = generate(server, text="Hello", sampling=greedy(5, logprobs=3))
    lps = [lp for r in rs for lp in r.logprobs]
    assert len(lps) == 5
    assert [lp.token_id for lp in lps] == [t for r in rs for t in r.token_ids]
    assert all(lp.logprob <= 0 and lp.rank >= 1 and len(lp.top_logprobs) == 3 for lp in lps)
    assert all(lp.rank == 1 for lp in lps)  # greedy picks the top token
    assert all(lp.top_logprobs[0].token_id == lp.token_id for lp in lps)
    assert all(isinstance(lp.token, str) for lp in lps)
    rest = server.rest("/v1/completions", {"prompt": "Hello", "max_tokens": 5, "temperature": 0, "logprobs": 3,
                                           "ignore_eos": True})
    for got, want in zip(lps, rest["choices"][0]["logprobs"]["token_logprobs"]):
        assert got.logprob == pytest.approx(want, abs=1e-5)
    none = generate(server, text="Hello", sampling=greedy(3))
    assert not any(r.logprobs for r in none)


def test_echo_and_skip_text_and_continuous_usage(server):
    rs = generate(server, text="Hello there", echo=True, sampling=greedy(4))
    plain = generate(server, text="Hello there", sampling=greedy(4))
    assert "".join(r.text for r in rs) == "Hello there" + "".join(r.text for r in plain)
    ids_only = generate(server, text="Hello there", sampling=greedy(4),
                        stream_options=pb.StreamOptions(skip_text=True, continuous_usage_stats=True))
    assert all(r.text == "" for r in ids_only)
    assert [t for r in ids_only for t in r.token_ids] == [t for r in plain for t in r.token_ids]
    assert all(r.HasField("usage") for r in ids_only)
    done = [r.usage.completion_tokens for r in ids_only]
    assert done == sorted(done) and done[-1] == 4


def test_logit_bias_bans_a_token_over_grpc(server):
    free = [t for r in generate(server, text="The quick brown fox", sampling=greedy(8)) for t in r.token_ids]
    banned = free[0]
    biased = [t for r in generate(server, text="The quick brown fox",
                                  sampling=greedy(8, logit_bias={banned: -100.0})) for t in r.token_ids]
    assert len(biased) == 8 and banned not in biased


def test_prompt_logprobs_over_grpc(server):
    ids = list(server.stub.Tokenize(pb.TokenizeRequest(text="The quick brown fox jumps")).token_ids)
    rs = generate(server, token_ids=pb.TokenIds(ids=ids), sampling=greedy(2, prompt_logprobs=1))
    first = rs[0]
    assert [p.token_id for p in first.prompt_logprobs] == ids[1:]
    assert all(p.logprob <= 0 and p.rank >= 1 and len(p.top_logprobs) == 1 for p in first.prompt_logprobs)
    assert all(len(r.prompt_logprobs) == 0 for r in rs[1:])


# ---- Tokenize / ListModels / health ----

@pytest.mark.parametrize("text", ["Hello, world!", "Paged attention stores keys and values", "  spaces  "])
@pytest.mark.parametrize("special", [True, False])
def test_tokenize_equals_the_cli(server, text, special):
    r = server.stub.Tokenize(pb.TokenizeRequest(text=text, add_special_tokens=special, return_token_strings=True))
    cli = subprocess.run([KVMESH, "tokenize", "--text", text, f"--add-special-tokens={str(special).lower()}"],
                         capture_output=True, text=True, check=True)
    assert list(r.token_ids) == json.loads(cli.stdout)
    assert r.count == len(r.token_ids)
    assert len(r.token_strings) == len(r.token_ids)
    assert r.max_model_len > 0


def test_tokenize_defaults_to_special_tokens(server):
    default = server.stub.Tokenize(pb.TokenizeRequest(text="Hello"))
    with_special = server.stub.Tokenize(pb.TokenizeRequest(text="Hello", add_special_tokens=True))
    assert list(default.token_ids) == list(with_special.token_ids)


def test_list_models(server):
    r = server.stub.ListModels(pb.ListModelsRequest())
    assert [m.id for m in r.models] == [MODEL]
    assert r.models[0].max_model_len > 0 and r.models[0].created_unix_s > 0
    rest = server.rest("/v1/models")
    assert [m["id"] for m in rest["data"]] == [m.id for m in r.models]


def test_health_serving_and_reflection(server):
    health = health_grpc.HealthStub(server.channel)
    for service in ("", "kvmesh.v1.Inference"):
        r = health.Check(health_pb.HealthCheckRequest(service=service), timeout=10)
        assert r.status == health_pb.HealthCheckResponse.SERVING


# ---- errors ----

C = grpc.StatusCode
BAD_GENERATE = [
    # (request fields, expected code, a word the message must contain)
    (dict(sampling=greedy(4)), C.INVALID_ARGUMENT, "prompt"),
    (dict(text="", sampling=greedy(4)), C.INVALID_ARGUMENT, "text"),
    (dict(token_ids=pb.TokenIds(ids=[]), sampling=greedy(4)), C.INVALID_ARGUMENT, "token_ids"),
    (dict(token_ids=pb.TokenIds(ids=[1, 10 ** 7]), sampling=greedy(4)), C.INVALID_ARGUMENT, "token_ids.ids[1]"),
    (dict(token_ids=pb.TokenIds(ids=[-3]), sampling=greedy(4)), C.INVALID_ARGUMENT, "token_ids.ids[0]"),
    (dict(text="x", sampling=sampling(temperature=-1)), C.INVALID_ARGUMENT, "sampling.temperature"),
    (dict(text="x", sampling=sampling(top_p=1.5)), C.INVALID_ARGUMENT, "sampling.top_p"),
    (dict(text="x", sampling=sampling(top_k=-5)), C.INVALID_ARGUMENT, "sampling.top_k"),
    (dict(text="x", sampling=sampling(max_tokens=0)), C.INVALID_ARGUMENT, "sampling.max_tokens"),
    (dict(text="x", sampling=sampling(max_tokens=10 ** 9)), C.INVALID_ARGUMENT, "sampling.max_tokens"),
    (dict(text="x", sampling=sampling(n=-1)), C.INVALID_ARGUMENT, "sampling.n"),
    (dict(text="x", sampling=sampling(n=100000)), C.INVALID_ARGUMENT, "sampling.n"),
    (dict(text="x", sampling=sampling(logprobs=50)), C.INVALID_ARGUMENT, "sampling.logprobs"),
    (dict(text="x", sampling=sampling(presence_penalty=3)), C.INVALID_ARGUMENT, "sampling.presence_penalty"),
    (dict(text="x", sampling=sampling(min_tokens=5, max_tokens=2)), C.INVALID_ARGUMENT, "sampling.min_tokens"),
    (dict(text="x", sampling=sampling(stop_token_ids=[10 ** 7])), C.INVALID_ARGUMENT, "sampling.stop_token_ids"),
    (dict(text="word " * 9000, sampling=greedy(4)), C.INVALID_ARGUMENT, "text"),
    (dict(chat=pb.ChatPrompt(), sampling=greedy(4)), C.INVALID_ARGUMENT, "chat.messages"),
    (dict(chat=pb.ChatPrompt(messages=[pb.ChatMessage(role="wizard", content="hi")]), sampling=greedy(4)),
     C.INVALID_ARGUMENT, "chat.messages"),
    (dict(chat=pb.ChatPrompt(messages=[pb.ChatMessage(role="user", content="hi")], chat_template="{% include 'other.jinja' %}"),
          sampling=greedy(4)), C.INVALID_ARGUMENT, "chat.chat_template"),
    (dict(model="nope", text="x", sampling=greedy(4)), C.NOT_FOUND, "nope"),
    (dict(text="x", sampling=sampling(logit_bias={5: 101.0})), C.INVALID_ARGUMENT, "logit_bias"),
    (dict(text="x", sampling=sampling(logit_bias={10 ** 7: 1.0})), C.INVALID_ARGUMENT, "logit_bias"),
    (dict(text="x", sampling=sampling(prompt_logprobs=50)), C.INVALID_ARGUMENT, "prompt_logprobs"),
]


@pytest.mark.parametrize("fields,code,word", BAD_GENERATE)
def test_bad_generate_gets_the_right_status(server, fields, code, word):
    with pytest.raises(grpc.RpcError) as e:
        generate(server, timeout=30, **fields)
    assert e.value.code() == code, e.value.details()
    assert word in e.value.details(), e.value.details()


BAD_TOKENIZE = [
    (dict(), C.INVALID_ARGUMENT, "prompt"),
    (dict(model="nope", text="x"), C.NOT_FOUND, "nope"),
    (dict(chat=pb.ChatPrompt(messages=[pb.ChatMessage(role="wizard", content="hi")])), C.INVALID_ARGUMENT,
     "chat.messages"),
]


@pytest.mark.parametrize("fields,code,word", BAD_TOKENIZE)
def test_bad_tokenize_gets_the_right_status(server, fields, code, word):
    with pytest.raises(grpc.RpcError) as e:
        server.stub.Tokenize(pb.TokenizeRequest(**fields), timeout=30)
    assert e.value.code() == code, e.value.details()
    assert word in e.value.details(), e.value.details()


def test_server_still_serves_after_bad_input(server):
    rs = generate(server, text="still alive", sampling=greedy(3))
    assert sum(len(r.token_ids) for r in rs) == 3


# ---- cancellation, deadlines, limits ----

def wait_kv_released(server, timeout_s=30):
    deadline = time.time() + timeout_s
    while time.time() < deadline and server.metric("kvmesh_kv_blocks", '{state="used"}') != 0:
        time.sleep(0.05)
    assert server.metric("kvmesh_kv_blocks", '{state="used"}') == 0
    while time.time() < deadline and server.metric("kvmesh_num_requests_running") != 0:
        time.sleep(0.05)
    assert server.metric("kvmesh_num_requests_running") == 0


def test_cancel_mid_stream_frees_every_kv_block(server):
    call = server.stub.Generate(pb.GenerateRequest(text="Tell me a long story", sampling=greedy(4000)),
                                timeout=RPC_TIMEOUT_S)
    got = 0
    for r in call:
        got += len(r.token_ids)
        if got >= 5:
            break
    assert server.metric("kvmesh_kv_blocks", '{state="used"}') > 0
    call.cancel()
    wait_kv_released(server)


def test_cancel_n_samples_mid_stream_frees_every_kv_block(server):
    call = server.stub.Generate(pb.GenerateRequest(text="Tell me a long story",
                                                   sampling=greedy(1000, n=4)), timeout=RPC_TIMEOUT_S)
    seen = 0
    for _ in call:
        seen += 1
        if seen >= 8:
            break
    call.cancel()
    wait_kv_released(server)


def test_deadline_exceeded_aborts_and_frees_kv(server):
    with pytest.raises(grpc.RpcError) as e:
        for _ in server.stub.Generate(pb.GenerateRequest(text="Tell me a long story", sampling=greedy(4000)),
                                      timeout=1.0):
            pass
    assert e.value.code() == C.DEADLINE_EXCEEDED
    wait_kv_released(server)


def test_slow_reader_gets_every_token(server):
    """Backpressure: the engine never waits for the client; a slow reader still gets the
    whole stream (deltas are merged while a write is in flight), in order."""
    fast = generate(server, text="Once upon a time", sampling=greedy(64))
    call = server.stub.Generate(pb.GenerateRequest(text="Once upon a time", sampling=greedy(64)),
                                timeout=RPC_TIMEOUT_S)
    slow = []
    for r in call:
        slow.append(r)
        time.sleep(0.05)
    assert [t for r in slow for t in r.token_ids] == [t for r in fast for t in r.token_ids]
    assert "".join(r.text for r in slow) == "".join(r.text for r in fast)


def test_concurrent_streams_all_complete(server):
    errors, counts = [], []

    def one(i):
        try:
            rs = generate(server, text=f"Request number {i}",
                          sampling=sampling(temperature=0.8, seed=i, max_tokens=24, ignore_eos=True))
            counts.append(sum(len(r.token_ids) for r in rs))
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:3]
    assert counts == [24] * 32


def test_over_the_inflight_limit_is_resource_exhausted_and_sigterm_drains():
    # Generous drain and call deadlines: ctest may run other servers beside this one, and
    # a drain that outlives its deadline aborts the stream (another behaviour).
    s = Server("--max-inflight-requests", "1", "--drain-timeout-ms", "180000")
    try:
        long_call = s.stub.Generate(pb.GenerateRequest(text="x", sampling=greedy(300)), timeout=240)
        first = next(long_call)  # admitted and running
        assert first.token_ids
        with pytest.raises(grpc.RpcError) as e:
            generate(s, text="y", sampling=greedy(2), timeout=30)
        assert e.value.code() == C.RESOURCE_EXHAUSTED
        # SIGTERM: the running stream finishes in full; new calls are refused.
        s.proc.terminate()
        rest = list(long_call)
        assert sum(len(r.token_ids) for r in [first] + rest) == 300
        assert rest[-1].finish_reason == common.FINISH_REASON_LENGTH
        assert s.proc.wait(timeout=60) == 0
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
        s.channel.close()


def test_grpc_port_minus_one_disables_grpc():
    proc = subprocess.Popen([KVMESH, "serve", "--host", "127.0.0.1", "--port", "0", "--grpc-port", "-1",
                             "--kv-cache-bytes", str(64 << 20)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            log.append(line)
            if "listening on http://" in line:
                break
        assert any("listening on http://" in l for l in log), "".join(log)
        assert not any("grpc listening" in l for l in log)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


# ---- API keys and admission, shared with REST ----

def test_api_keys_are_checked_on_the_grpc_api_as_on_rest():
    s = Server("--api-keys", "secret1,secret2")
    try:
        with pytest.raises(grpc.RpcError) as missing:
            generate(s, text="hi", sampling=greedy(2))
        assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as wrong:
            list(s.stub.Generate(pb.GenerateRequest(text="hi", sampling=greedy(2)), timeout=RPC_TIMEOUT_S,
                                 metadata=[("authorization", "Bearer secret3")]))
        assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as models:
            s.stub.ListModels(pb.ListModelsRequest(), timeout=RPC_TIMEOUT_S)
        assert models.value.code() == grpc.StatusCode.UNAUTHENTICATED
        rs = list(s.stub.Generate(pb.GenerateRequest(text="hi", sampling=greedy(2)), timeout=RPC_TIMEOUT_S,
                                  metadata=[("authorization", "Bearer secret2")]))
        assert sum(len(r.token_ids) for r in rs) == 2
    finally:
        assert s.stop() == 0


def test_a_per_key_rate_limit_answers_resource_exhausted_with_retry_after():
    # One request per key, refilled at one per 1000 s: the second is refused, on either door.
    s = Server("--api-keys", "k1,k2", "--key-requests-per-s", "0.001", "--key-request-burst", "1")
    try:
        auth = lambda key: [("authorization", f"Bearer {key}")]
        list(s.stub.Generate(pb.GenerateRequest(text="hi", sampling=greedy(2)), timeout=RPC_TIMEOUT_S,
                             metadata=auth("k1")))
        with pytest.raises(grpc.RpcError) as limited:
            list(s.stub.Generate(pb.GenerateRequest(text="hi", sampling=greedy(2)), timeout=RPC_TIMEOUT_S,
                                 metadata=auth("k1")))
        assert limited.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        trailers = dict(limited.value.trailing_metadata() or ())
        assert int(trailers["retry-after"]) >= 1
        # The REST door shares the bucket: k1 is limited there too, k2 is not.
        req = urllib.request.Request(f"http://127.0.0.1:{s.port}/v1/completions",
                                     data=json.dumps({"prompt": "hi", "max_tokens": 2}).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": "Bearer k1"})
        with pytest.raises(urllib.error.HTTPError) as rest_limited:
            urllib.request.urlopen(req, timeout=RPC_TIMEOUT_S)
        assert rest_limited.value.code == 429
        assert int(rest_limited.value.headers["Retry-After"]) >= 1
        assert json.loads(rest_limited.value.read())["error"]["type"] == "rate_limit_error"
        rs = list(s.stub.Generate(pb.GenerateRequest(text="hi", sampling=greedy(2)), timeout=RPC_TIMEOUT_S,
                                  metadata=auth("k2")))
        assert sum(len(r.token_ids) for r in rs) == 2
    finally:
        assert s.stop() == 0


def test_stop_string_limits_are_invalid_argument(server):
    with pytest.raises(grpc.RpcError) as error:
        generate(server, text="hi", sampling=greedy(2, stop=["x" * 300]))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "sampling.stop[0]" in error.value.details()
