"""The kvmesh CLI as a user runs it: real processes on the built binary."""

import json
import os
import shutil
import subprocess

import pytest

KVMESH = os.environ["KVMESH_BIN"]
MODELS = os.environ["KVMESH_MODELS_DIR"]
TINY = os.path.join(MODELS, "tiny-llama")


def run(*args, check=True, **kwargs):
    proc = subprocess.run([KVMESH, *args], capture_output=True, text=True, timeout=300, **kwargs)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_help_lists_subcommands():
    out = run("--help").stdout
    for cmd in ("serve", "generate", "tokenize", "bench"):
        assert cmd in out


def test_generate_help_lists_its_flags():
    out = run("generate", "--help", check=False)
    text = out.stdout + out.stderr
    for flag in ("--prompt", "--max_tokens", "--temperature", "--top_p", "--seed", "--json", "--model"):
        assert flag in text


def test_tokenize_matches_hugging_face_tokenizers():
    tokenizers = pytest.importorskip("tokenizers")
    text = "Hello world! Paged attention, 键值缓存 🚀 and  spaces\n\ttabs 12345"
    ours = json.loads(run("tokenize", "--text", text).stdout)
    theirs = tokenizers.Tokenizer.from_file(os.path.join(TINY, "tokenizer.json")).encode(text).ids
    assert ours == theirs


def test_tokenize_reads_standard_input():
    ours = json.loads(run("tokenize", input="abc def").stdout)
    assert json.loads(run("tokenize", "--text", "abc def").stdout) == ours


def test_generate_json_streams_one_object_per_token():
    out = run("generate", "--prompt", "The quick brown fox", "--max-tokens", "12", "--json",
              "--temperature", "0").stdout
    lines = [json.loads(l) for l in out.splitlines() if l.strip()]
    assert 1 <= len(lines) <= 12
    for obj in lines:
        assert isinstance(obj["id"], int)
        assert isinstance(obj["text"], str)
        assert obj["logprob"] <= 0.0


def test_generate_runs_tensor_parallel_through_the_engine():
    """--tensor-parallel-size 2 runs on the tensor-parallel runner (the dense path runs one
    whole model): the greedy tokens equal the single-process ones."""
    args = ["generate", "--prompt", "The quick brown fox", "--max-tokens", "8", "--json", "--temperature", "0",
            "--ignore-eos", "--kv-cache-dtype", "f32"]
    one = [json.loads(l)["id"] for l in run(*args).stdout.splitlines() if l.strip()]
    two = [json.loads(l)["id"] for l in run(*args, "--tensor-parallel-size", "2").stdout.splitlines() if l.strip()]
    assert len(one) == 8
    assert two == one


def test_compute_dtype_bf16_generates_and_bad_values_are_clear_errors():
    """--compute-dtype bf16 (bf16 dot products) runs the engine, on one process and on a
    tensor-parallel group; anything but f32 / bf16, or bf16 off the CPU backend, is refused."""
    args = ["generate", "--prompt", "The quick brown fox", "--max-tokens", "8", "--json", "--temperature", "0",
            "--ignore-eos", "--kv-cache-dtype", "f32", "--compute-dtype", "bf16"]
    one = [json.loads(l)["id"] for l in run(*args).stdout.splitlines() if l.strip()]
    two = [json.loads(l)["id"] for l in run(*args, "--tensor-parallel-size", "2").stdout.splitlines() if l.strip()]
    assert len(one) == 8 and len(two) == 8
    bad = run("generate", "--prompt", "hi", "--compute-dtype", "f16", check=False)
    assert bad.returncode != 0 and "--compute-dtype must be f32 or bf16, not \"f16\"" in bad.stderr, bad.stderr
    bad = run("generate", "--prompt", "hi", "--compute-dtype", "bf16", "--backend", "reference", check=False)
    assert bad.returncode != 0 and "--compute-dtype bf16 applies to --device cpu with --backend cpu" in bad.stderr


def test_greedy_generation_matches_transformers_fixture():
    """The first prompt of the bf16 fixture, decoded greedily by the CLI.

    The fixture is transformers in float32 (weights widened, f32 KV), so the CLI keeps
    its KV in f32 too; the default for a bf16 model (auto) is a bf16 KV cache, whose
    rounding is allowed to change later tokens."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "tests", "data", "reference", "tiny-llama.json")) as f:
        case = json.load(f)["cases"][0]
    args = ["generate", "--prompt", "The quick brown fox jumps over the lazy dog.", "--max-tokens", "16",
            "--temperature", "0", "--ignore-eos", "--json"]
    out = run(*args, "--kv-cache-dtype", "f32").stdout
    ids = [json.loads(l)["id"] for l in out.splitlines() if l.strip()]
    assert ids == case["greedy_ids"][:16]
    # bf16 KV: the first token comes from the prompt's attention at bf16 KV precision
    # and still agrees; an unknown element type is refused.
    out = run(*args, "--kv-cache-dtype", "bf16").stdout
    assert json.loads(out.splitlines()[0])["id"] == case["greedy_ids"][0]
    bad = subprocess.run([KVMESH, *args, "--kv-cache-dtype", "fp4"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--kv-cache-dtype must be auto, f32, bf16 or fp8" in bad.stderr


def test_seeded_sampling_is_reproducible_and_seed_dependent():
    args = ["generate", "--prompt", "Once upon a time", "--max-tokens", "24", "--temperature", "1.0",
            "--top-p", "0.95", "--ignore-eos", "--json"]
    a = run(*args, "--seed", "5").stdout
    b = run(*args, "--seed", "5").stdout
    c = run(*args, "--seed", "6").stdout
    assert a == b
    assert a != c


def test_streamed_text_equals_decoded_ids():
    tokenizers = pytest.importorskip("tokenizers")
    out = run("generate", "--prompt", "键值缓存 🚀", "--max-tokens", "20", "--temperature", "1.0", "--seed", "3",
              "--ignore-eos", "--json").stdout
    objs = [json.loads(l) for l in out.splitlines() if l.strip()]
    tok = tokenizers.Tokenizer.from_file(os.path.join(TINY, "tokenizer.json"))
    assert "".join(o["text"] for o in objs) == tok.decode([o["id"] for o in objs], skip_special_tokens=True)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU is here: tools/gpu-check runs --device cuda")
def test_device_cuda_without_a_gpu_is_a_clear_error():
    args = ["generate", "--prompt", "hi", "--max-tokens", "2"]
    bad = subprocess.run([KVMESH, *args, "--device", "cuda"], capture_output=True, text=True)
    assert bad.returncode != 0
    # Either no GPU here or a build without nvcc: both say what --device cuda needs.
    assert "--device cuda needs a GPU" in bad.stderr or "built without CUDA" in bad.stderr, bad.stderr
    bad = subprocess.run([KVMESH, *args, "--device", "tpu"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--device must be cpu, cuda or cuda:N" in bad.stderr
    # FP8 KV is a GPU feature: the CPU backends keep f32 or bf16.
    bad = subprocess.run([KVMESH, *args, "--kv-cache-dtype", "fp8"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--kv-cache-dtype fp8 needs --device cuda" in bad.stderr
    # Other commands refuse the same way; a prefill worker cannot run on the GPU yet.
    bad = subprocess.run([KVMESH, "bench", "throughput", "--num-prompts", "1", "--device", "cuda"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "CUDA" in bad.stderr, bad.stderr


def test_missing_model_directory_is_a_clear_error():
    proc = run("generate", "--model", "/nonexistent/model", "--prompt", "hi", check=False)
    assert proc.returncode != 0
    assert "/nonexistent/model" in proc.stderr


def test_corrupt_weights_are_a_clear_error(tmp_path):
    bad = tmp_path / "model"
    shutil.copytree(TINY, bad)
    weights = bad / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])  # truncated mid-tensor
    proc = run("generate", "--model", str(bad), "--prompt", "hi", check=False)
    assert proc.returncode != 0
    assert "model.safetensors" in proc.stderr
    assert "Traceback" not in proc.stderr and "terminate" not in proc.stderr


def test_prompt_longer_than_context_is_rejected():
    proc = run("generate", "--prompt", "word " * 9000, "--max-tokens", "4", check=False)
    assert proc.returncode != 0
    assert "context" in proc.stderr


def test_bad_flag_values_are_rejected():
    for args in (["--temperature", "-1"], ["--top-p", "1.5"], ["--max-tokens", "0"]):
        proc = run("generate", "--prompt", "hi", *args, check=False)
        assert proc.returncode != 0, args
        assert proc.stderr.strip(), args


@pytest.mark.parametrize("args, message", [
    (["serve", "--port", "80000"], "--port=80000 is out of range [0, 65535]"),
    (["serve", "--grpc-port", "-2"], "--grpc_port=-2 is out of range [-1, 65535]"),
    (["generate", "--prompt", "x", "--top-p", "1.5"], "--top_p=1.5 is out of range [0, 1]"),
    (["worker", "--listen", "127.0.0.1:99999"], "--listen: address \"127.0.0.1:99999\": port 99999 is out of range"),
])
def test_out_of_range_flags_are_refused_naming_the_flag(args, message):
    # These used to wrap at 65536 (port 80000 listened on 14464) or pass unchecked.
    proc = run(*args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr


def test_out_of_range_environment_defaults_are_refused_too():
    proc = run("serve", check=False, env=dict(os.environ, KVMESH_PORT="65536"))
    assert proc.returncode == 2
    assert "--port=65536 is out of range" in proc.stderr
