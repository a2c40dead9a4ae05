#!/usr/bin/env python3
"""PyTorch reference numbers on the shapes of kvmesh's CUDA benchmarks (tools/gpu-check).

Rows appended to --csv (the benchmarks' CSV format), paired with ours by `case`:
  torch_sdpa_decode   b{batch}_ctx{context}_bf16: one query token per sequence, 32 query
                      heads, 8 KV heads, head_dim 128, bf16; batch 1/32/128 x context
                      1k/8k/32k. GB/s counts K + V read (every sequence's context, all KV
                      heads) + q + out, as paged_attention_decode's does.
  torch_sdpa_prefill  {num_seqs}x{new_tokens}_prefix{prefix}: 1x1024, 1x4096, 1x16384,
                      8x2048 (causal), 1x512 over an 8192-token prefix (causal, aligned to
                      the bottom right). TFLOP/s = 4 * H * D * (attended query-key pairs)
                      / time, as paged_attention_prefill's does.
  torch_ceiling       d2d_copy_4096MiB (bytes read + written), gemm_bf16_8192x8192x8192
                      (TFLOP/s) and the decode projections gemm_bf16_m{M}_k4096_n{N}
                      (GB/s of W + X + D), the cases cuda_ceilings_bench measures too.

Attention runs torch.nn.functional.scaled_dot_product_attention on contiguous tensors
(q [B, 32, Lq, 128], k/v [B, 8, Lk, 128]) with enable_gqa=True; where a backend refuses
GQA, k/v are expanded to 32 heads and the notes say so. Each of the fused backends
(flash, memory-efficient, cuDNN; never the unfused math one) is timed alone and the
fastest is reported, the others in the notes. Timing: torch.cuda.Event around each rep,
3 warm-ups, median of >= 20 reps, rotating among copies of the inputs that together
exceed the 60 MB L2 (the dense layout here is kinder than a paged pool: no block table).

Usage: gpu_bench_torch.py [--csv PATH] [--quick] [--only decode,prefill,ceilings]
Without PyTorch or a GPU it says so and exits 0.
"""

import argparse
import csv
import math
import os
import sys

HEADER = ["kernel", "case", "batch", "context", "num_heads", "num_kv_heads", "head_dim", "kv_dtype",
          "median_us", "achieved_gbps", "achieved_tflops", "notes"]
L2_BYTES = 60 << 20
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128
MAX_EXPANDED_BYTES = 40 << 30  # expanding k/v to 32 heads costs 4x their memory; skip past this


def median_us(torch, run, reps, warmup=3):
    """Median microseconds of run(i) between CUDA events, after `warmup` untimed calls."""
    for i in range(warmup):
        run(i)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        run(warmup + i)
        stops[i].record()
    torch.cuda.synchronize()
    times = sorted(1000.0 * s.elapsed_time(e) for s, e in zip(starts, stops))
    return times[reps // 2]


def copies_past_l2(set_bytes, cap=64):
    return max(1, min(cap, math.ceil(2 * L2_BYTES / set_bytes)))


class Bench:
    def __init__(self, torch, args):
        self.torch = torch
        self.quick = args.quick
        self.reps = 20 if args.quick else 30
        self.rows = []
        from torch.nn.attention import SDPBackend
        # cuDNN last: were it to break the CUDA context, the others' numbers are in already.
        self.backends = [("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                         ("cudnn", SDPBackend.CUDNN_ATTENTION)]

    def add(self, kernel, case, batch, context, kv_dtype, us, gbps, tflops, notes):
        self.rows.append([kernel, case, batch, context, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, kv_dtype,
                          f"{us:.3f}", f"{gbps:.1f}", f"{tflops:.2f}", notes.replace(",", ";")])
        print(f"{kernel:20s} {case:24s} {us:12.2f} us {gbps:9.1f} GB/s {tflops:8.2f} TFLOP/s  {notes}",
              flush=True)

    def sdpa_best(self, sets, mask_for, is_causal):
        """Times each fused backend on `sets` (list of (q, k, v)); returns (us, notes) of the
        fastest, or (None, why) if none ran. mask_for(q, k) gives an attn_mask or None."""
        torch = self.torch
        F = torch.nn.functional
        from torch.nn.attention import sdpa_kernel
        results, failures, expanded_sets = {}, [], None
        for name, backend in self.backends:
            for gqa_mode in ("gqa", "expanded"):
                if gqa_mode == "expanded":
                    if expanded_sets is None:
                        kv_bytes = sum(2 * k.numel() * k.element_size() for _, k, _ in sets)
                        if 4 * kv_bytes > MAX_EXPANDED_BYTES:
                            failures.append(f"{name}: refused GQA and expanding k/v needs too much memory")
                            break
                        group = NUM_HEADS // NUM_KV_HEADS
                        expanded_sets = [(q, k.repeat_interleave(group, dim=1).contiguous(),
                                          v.repeat_interleave(group, dim=1).contiguous()) for q, k, v in sets]
                    use = expanded_sets
                else:
                    use = sets

                def run(i, use=use, gqa=(gqa_mode == "gqa")):
                    q, k, v = use[i % len(use)]
                    kwargs = {"enable_gqa": True} if gqa else {}
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask_for(q, k), is_causal=is_causal,
                                                          **kwargs)
                try:
                    with sdpa_kernel([backend]):
                        out = run(0)
                        if not torch.isfinite(out).all():
                            raise RuntimeError("non-finite output")
                        us = median_us(torch, run, self.reps)
                    results[name] = (us, gqa_mode)
                    break
                except (RuntimeError, TypeError, ValueError) as e:
                    first_line = str(e).strip().splitlines()[0][:80] if str(e).strip() else type(e).__name__
                    failures.append(f"{name}/{gqa_mode}: {first_line}")
                    torch.cuda.synchronize()
        del expanded_sets
        if not results:
            return None, "no fused SDPA backend ran: " + " | ".join(failures)
        best = min(results, key=lambda n: results[n][0])
        us, mode = results[best]
        notes = f"sdpa {best}" + (" kv expanded to 32 heads" if mode == "expanded" else " enable_gqa")
        others = [f"{n}={results[n][0]:.1f}us" for n in results if n != best]
        if others:
            notes += "; also " + " ".join(others)
        refused = [n for n, _ in self.backends if n not in results]
        if refused:
            notes += "; refused: " + " ".join(refused)
        return us, notes

    def decode(self):
        torch = self.torch
        batches = [1, 32] if self.quick else [1, 32, 128]
        contexts = [1024, 8192] if self.quick else [1024, 8192, 32768]
        for batch in batches:
            for context in contexts:
                kv_bytes = 2 * batch * NUM_KV_HEADS * context * HEAD_DIM * 2
                qo_bytes = 2 * batch * NUM_HEADS * HEAD_DIM * 2
                n = copies_past_l2(kv_bytes + qo_bytes)
                sets = [(torch.randn(batch, NUM_HEADS, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16),
                         torch.randn(batch, NUM_KV_HEADS, context, HEAD_DIM, device="cuda", dtype=torch.bfloat16),
                         torch.randn(batch, NUM_KV_HEADS, context, HEAD_DIM, device="cuda", dtype=torch.bfloat16))
                        for _ in range(n)]
                us, notes = self.sdpa_best(sets, lambda q, k: None, is_causal=False)
                case = f"b{batch}_ctx{context}_bf16"
                if us is None:
                    print(f"torch_sdpa_decode {case}: {notes}", flush=True)
                else:
                    gbps = (kv_bytes + qo_bytes) / (us * 1e3)
                    self.add("torch_sdpa_decode", case, batch, context, "bf16", us, gbps, 0.0,
                             f"{notes}; {n} rotating copies; dense contiguous KV")
                del sets
                torch.cuda.empty_cache()

    def prefill(self):
        torch = self.torch
        cases = [(1, 1024, 0), (8, 2048, 0), (1, 512, 8192)] if self.quick else \
            [(1, 1024, 0), (1, 4096, 0), (1, 16384, 0), (8, 2048, 0), (1, 512, 8192)]
        for num_seqs, new_tokens, prefix in cases:
            keys = prefix + new_tokens
            pairs = num_seqs * (new_tokens * prefix + new_tokens * (new_tokens + 1) // 2)
            flops = 4.0 * NUM_HEADS * HEAD_DIM * pairs
            q_bytes = num_seqs * NUM_HEADS * new_tokens * HEAD_DIM * 2
            kv_bytes = 2 * num_seqs * NUM_KV_HEADS * keys * HEAD_DIM * 2
            set_bytes = 2 * q_bytes + kv_bytes  # q + out + k + v
            n = copies_past_l2(set_bytes)
            sets = [(torch.randn(num_seqs, NUM_HEADS, new_tokens, HEAD_DIM, device="cuda", dtype=torch.bfloat16),
                     torch.randn(num_seqs, NUM_KV_HEADS, keys, HEAD_DIM, device="cuda", dtype=torch.bfloat16),
                     torch.randn(num_seqs, NUM_KV_HEADS, keys, HEAD_DIM, device="cuda", dtype=torch.bfloat16))
                    for _ in range(n)]
            mask_note = "is_causal"
            if prefix == 0:
                mask_for, is_causal = (lambda q, k: None), True
            else:
                # Query i (of new_tokens) sees keys 0..prefix+i: causal aligned to the bottom right.
                try:
                    from torch.nn.attention.bias import causal_lower_right
                    bias = causal_lower_right(new_tokens, keys)
                    mask_note = "causal_lower_right"
                except ImportError:
                    rows = torch.arange(new_tokens, device="cuda").unsqueeze(1)
                    cols = torch.arange(keys, device="cuda").unsqueeze(0)
                    bias = cols <= rows + prefix
                    mask_note = "explicit bottom-right bool mask"
                mask_for, is_causal = (lambda q, k, bias=bias: bias), False
            us, notes = self.sdpa_best(sets, mask_for, is_causal)
            case = f"{num_seqs}x{new_tokens}_prefix{prefix}"
            if us is None:
                print(f"torch_sdpa_prefill {case}: {notes}", flush=True)
            else:
                self.add("torch_sdpa_prefill", case, num_seqs, keys, "bf16", us, set_bytes / (us * 1e3),
                         flops / (us * 1e6), f"{notes}; {mask_note}; {n} rotating copies")
            del sets
            torch.cuda.empty_cache()

    def ceilings(self):
        torch = self.torch
        mib = 256 if self.quick else 4096
        src = torch.randint(-2**31, 2**31 - 1, (mib << 18,), device="cuda", dtype=torch.int32)
        dst = torch.empty_like(src)
        us = median_us(torch, lambda i: dst.copy_(src), self.reps)
        nbytes = 2 * src.numel() * 4
        self.rows.append(["torch_ceiling", f"d2d_copy_{mib}MiB", 0, 0, 0, 0, 0, "-", f"{us:.3f}",
                          f"{nbytes / (us * 1e3):.1f}", "0.00", "Tensor.copy_ (clone without allocation); bytes read + written"])
        print(f"torch_ceiling d2d_copy_{mib}MiB {us:.2f} us {nbytes / (us * 1e3):.1f} GB/s", flush=True)
        del src, dst
        torch.cuda.empty_cache()
        big = 2048 if self.quick else 8192
        shapes = [(big, big, big, f"gemm_bf16_{big}x{big}x{big}")]
        for n_out in (4096, 14336):
            for m in ([1, 32] if self.quick else [1, 8, 32, 64, 128]):
                shapes.append((m, n_out, 4096, f"gemm_bf16_m{m}_k4096_n{n_out}"))
        for m, n_out, k, case in shapes:
            set_bytes = 2 * (m * k + n_out * k + m * n_out)
            n = copies_past_l2(set_bytes)
            sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                     torch.randn(n_out, k, device="cuda", dtype=torch.bfloat16)) for _ in range(n)]
            outs = [torch.empty(m, n_out, device="cuda", dtype=torch.bfloat16) for _ in range(n)]

            def run(i, sets=sets, outs=outs):
                x, w = sets[i % len(sets)]
                torch.matmul(x, w.t(), out=outs[i % len(outs)])
            us = median_us(torch, run, self.reps)
            tflops = 2.0 * m * n_out * k / (us * 1e6)
            gbps = set_bytes / (us * 1e3)
            self.rows.append(["torch_ceiling", case, m, 0, 0, 0, 0, "bf16", f"{us:.3f}", f"{gbps:.1f}",
                              f"{tflops:.2f}", f"torch.matmul(x; w.t()); bytes = W + X + D; {n} rotating copies"])
            print(f"torch_ceiling {case} {us:.2f} us {gbps:.1f} GB/s {tflops:.2f} TFLOP/s", flush=True)
            del sets, outs
            torch.cuda.empty_cache()


def append_csv(path, rows):
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(HEADER)
        w.writerows(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", help="append rows to this CSV file")
    parser.add_argument("--quick", action="store_true", help="a few small cases (smoke run)")
    parser.add_argument("--only", default="decode,prefill,ceilings", help="comma-separated parts to run")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("gpu_bench_torch: PyTorch is not installed here; no reference numbers")
        return 0
    if not torch.cuda.is_available():
        print("gpu_bench_torch: no GPU here (torch.cuda.is_available() is False); no reference numbers")
        return 0
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    print(f"gpu_bench_torch: torch {torch.__version__} on {props.name} ({props.multi_processor_count} SMs)",
          flush=True)
    bench = Bench(torch, args)
    status = 0
    for part in args.only.split(","):
        try:
            getattr(bench, part)()
        except Exception as e:  # one part failing must not lose the others' rows
            print(f"gpu_bench_torch: {part} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            status = 1
        if args.csv:
            append_csv(args.csv, bench.rows)
            bench.rows = []
    return status


if __name__ == "__main__":
    sys.exit(main())
