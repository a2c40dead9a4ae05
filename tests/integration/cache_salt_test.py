"""vLLM's cache_salt through `kvmesh serve`'s two front doors and through the
disaggregated cluster: requests share cached KV only when their salts are equal (usage's
cached tokens say so), and a bad salt is an OpenAI-style 400 (REST) or INVALID_ARGUMENT
(gRPC) naming cache_salt."""

import json
import os
import urllib.error
import urllib.request

import pytest

# `server`: serve_grpc_test's fixture, `kvmesh serve` with REST and gRPC.
from serve_grpc_test import common, generate, greedy, pb, server  # noqa: E402,F401

grpc = pytest.importorskip("grpc")

# Long enough for several full KV blocks; each test uses its own so no test sees
# another's cached blocks.
PROMPT = ("In a paged KV cache every full block of tokens is hashed with its whole prefix, "
          "so two requests reuse a block only when everything before it matches too. ")


@pytest.fixture(scope="module")
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused")


def expect_sharing_only_within_a_salt(cached_tokens):
    """cached_tokens(salt) runs one request of a fresh prompt and returns its cached tokens."""
    assert cached_tokens("tenant-a") == 0
    assert cached_tokens("tenant-a") > 0
    assert cached_tokens("tenant-b") == 0
    assert cached_tokens(None) == 0
    assert cached_tokens(None) > 0
    assert cached_tokens("tenant-b") > 0


def cached_completion_tokens(client, prompt, salt):
    extra = {"ignore_eos": True}
    if salt is not None:
        extra["cache_salt"] = salt
    r = client.completions.create(model="tiny-llama", prompt=prompt, max_tokens=2, temperature=0, extra_body=extra)
    assert r.usage.prompt_tokens > 32
    return r.usage.prompt_tokens_details.cached_tokens


def test_rest_completions_share_cached_kv_only_within_a_salt(client):
    prompt = "Completions. " + PROMPT * 2
    expect_sharing_only_within_a_salt(lambda salt: cached_completion_tokens(client, prompt, salt))


def test_rest_chat_shares_cached_kv_only_within_a_salt(client):
    messages = [{"role": "user", "content": "Chat. " + PROMPT * 2}]

    def cached(salt):
        r = client.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=2, temperature=0,
                                           extra_body={"cache_salt": salt})
        return r.usage.prompt_tokens_details.cached_tokens

    assert cached("tenant-a") == 0
    assert cached("tenant-a") > 0
    assert cached("tenant-c") == 0


@pytest.mark.parametrize("path,extra", [
    ("/v1/completions", {"prompt": "x"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
])
@pytest.mark.parametrize("salt,words", [
    ("", "must be a non-empty string"),
    (42, "must be a non-empty string"),
    (["a"], "must be a non-empty string"),
    ("s" * 1025, "at most 1024 bytes"),
])
def test_rest_bad_cache_salt_is_a_400_naming_it(server, path, extra, salt, words):
    body = json.dumps({**extra, "max_tokens": 1, "cache_salt": salt}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", data=body,
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 400
    err = json.loads(e.value.read())["error"]
    assert err["param"] == "cache_salt", err
    assert err["type"] == "invalid_request_error", err
    assert "'cache_salt'" in err["message"] and words in err["message"], err


def grpc_cached_tokens(server, text, salt):
    fields = {} if salt is None else {"cache_salt": salt}
    rs = generate(server, text=text, sampling=greedy(2), stream_options=pb.StreamOptions(include_usage=True), **fields)
    assert [r.finish_reason for r in rs if r.finish_reason] == [common.FINISH_REASON_LENGTH]
    return rs[-1].usage.cached_prompt_tokens


def test_grpc_shares_cached_kv_only_within_a_salt(server):
    text = "gRPC. " + PROMPT * 2
    expect_sharing_only_within_a_salt(lambda salt: grpc_cached_tokens(server, text, salt))


@pytest.mark.parametrize("salt,words", [("", "must be a non-empty string"), ("s" * 1025, "at most 1024 bytes")])
def test_grpc_bad_cache_salt_is_invalid_argument_naming_it(server, salt, words):
    with pytest.raises(grpc.RpcError) as e:
        generate(server, timeout=30, text="x", sampling=greedy(1), cache_salt=salt)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert "cache_salt" in e.value.details() and words in e.value.details(), e.value.details()


def test_the_cluster_shares_cached_kv_only_within_a_salt():
    """Router -> scheduler -> prefill and decode workers (tools/dev-cluster): the salt
    reaches the decode worker's prefix lookup, which the router reports as cached tokens,
    and the prefill worker's, whose /metrics count its prefix-cache hits."""
    if "KVMESH_SCHEDULER_BIN" not in os.environ:
        pytest.skip("needs KVMESH_SCHEDULER_BIN (the cache_salt_integration ctest sets it)")
    import cluster_test  # noqa: E402 (reads KVMESH_SCHEDULER_BIN at import)

    cluster = cluster_test.Cluster()
    try:
        client = cluster_test._client(cluster.url)
        prompt = "Cluster. " + PROMPT * 2

        def prefill_hit_tokens():
            return cluster_test._metric(cluster_test._worker_metrics(cluster, "prefill"), "kvmesh_prefix_cache_hits")

        def cached(salt):
            before = prefill_hit_tokens()
            tokens = cached_completion_tokens(client, prompt, salt)
            if tokens == 0:  # a miss on the decode worker is one on the prefill worker too
                assert prefill_hit_tokens() == before, f"the prefill worker reused KV across salts ({salt!r})"
            return tokens

        expect_sharing_only_within_a_salt(cached)
    except AssertionError:
        print(cluster.logs())
        raise
    finally:
        cluster.stop()
