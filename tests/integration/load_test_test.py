"""tools/load-test against a real `kvmesh serve`: --save-result writes vLLM's
`bench serve --save-result` fields with values that agree with the run, and --plot
writes PNG files that decode as images."""

import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib

KVMESH = os.environ["KVMESH_BIN"]
LOAD_TEST = os.path.join(os.path.dirname(__file__), "..", "..", "tools", "load-test")

VLLM_FIELDS = ["date", "backend", "model_id", "tokenizer_id", "num_prompts", "request_rate", "burstiness",
               "max_concurrency", "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
               "request_throughput", "output_throughput", "total_token_throughput", "input_lens", "output_lens",
               "ttfts", "itls", "start_times", "generated_texts", "errors"]
SUMMARIES = [f"{stat}_{metric}_ms" for metric in ("ttft", "tpot", "itl", "e2el")
             for stat in ("mean", "median", "std", "p99")]


def png_size(path):
    """(width, height) of a PNG after checking its signature and every chunk's CRC and
    inflating its image data: a truncated or corrupt file fails here."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    pos, size, idat, seen_end = 8, None, b"", False
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, (path, kind)
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            seen_end = True
        pos += 12 + length
    assert seen_end and size, path
    width, height = size
    raw = zlib.decompress(idat)
    assert len(raw) >= height * (width + 1), path  # at least one byte per pixel per row, plus filters
    return size


def test_save_result_and_plots():
    with tempfile.TemporaryDirectory() as tmp:
        result_path = os.path.join(tmp, "result.json")
        plot_dir = os.path.join(tmp, "plots")
        levels, per_client, output_len = [1, 2], 2, 6
        run = subprocess.run(
            [sys.executable, LOAD_TEST, "--start", KVMESH, "--serve-args", f"--kv-cache-bytes {64 << 20}",
             "--concurrency", *map(str, levels), "--requests-per-client", str(per_client), "--input-len", "8",
             "--output-len", str(output_len), "--max-seconds", "120", "--save-result", result_path,
             "--plot", plot_dir],
            capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout + run.stderr
        with open(result_path, encoding="utf-8") as f:
            saved = json.load(f)
        assert isinstance(saved, list) and len(saved) == len(levels)
        for result, concurrency in zip(saved, levels):
            for field in VLLM_FIELDS + SUMMARIES:
                assert field in result, field
            n = concurrency * per_client
            assert result["max_concurrency"] == concurrency
            assert result["num_prompts"] == n
            assert result["completed"] == n and result["failed"] == 0
            assert result["model_id"] == "tiny-llama"
            assert result["request_rate"] == "inf"
            assert result["output_lens"] == [output_len] * n
            assert result["total_output_tokens"] == n * output_len
            assert sum(result["input_lens"]) == result["total_input_tokens"] > 0
            assert result["errors"] == [""] * n
            assert len(result["ttfts"]) == n and all(t > 0 for t in result["ttfts"])
            # One gap per streamed event after the first: at most output_len - 1 per request.
            assert all(1 <= len(itl) <= output_len - 1 for itl in result["itls"]), result["itls"]
            assert all(isinstance(t, str) and t for t in result["generated_texts"])
            assert abs(result["output_throughput"] * result["duration"] - result["total_output_tokens"]) < 1e-6
            assert result["p99_ttft_ms"] >= result["median_ttft_ms"] > 0
            assert abs(result["mean_ttft_ms"] - 1e3 * sum(result["ttfts"]) / n) < 1e-6
        for name in ("ttft_distribution.png", "itl_distribution.png", "throughput_vs_concurrency.png"):
            width, height = png_size(os.path.join(plot_dir, name))
            assert width >= 400 and height >= 300, (name, width, height)
