// Top-k / top-p sampling of one token per row of logits on the device, with the
// semantics of engine::SequenceSampler (libs/engine/sampler.cc) steps 3-5 and 7:
//
//   1. temperature < 1e-5 (or NaN): greedy, the argmax, lowest id on ties; steps 2-4 skipped;
//   2. weights w = exp((logit - max logit) / T) in f32: softmax(logits / T) unnormalised;
//   3. top-k (k > 0 and k < vocab): the k highest logits, lowest ids first on ties;
//   4. top-p (p < 1): over the top-k survivors ordered by logit (highest first, lowest id
//      first on ties), keep a token while the weight strictly before it is below p x the
//      survivors' total (vLLM's order: top-k first, then top-p renormalised over them);
//   5. one uniform u in [0, 1) from Philox-4x32-10 (philox.cuh: key = seeds[row], counter =
//      offsets[row]); the token is the first survivor IN ID ORDER whose inclusive prefix
//      sum of weights exceeds u x the survivors' total (sums in f64).
//
// NaN logits count as -inf and +inf as the largest finite float (as the sampler's
// SanitizeLogit), so a NaN is never chosen. No sort of the vocabulary: one CTA per row
// finds the top-k cut (a count) and then the top-p cut (a mass) each by a 16-way search
// over the logits' 32-bit order keys (15 pivots per pass over the row, about 8 passes),
// then draws with one inverse-CDF pass over the survivors. Deterministic: the same
// logits, seed and offset give the same token on every run (no atomics in any sum).
//
// Versus the CPU sampler: the same survivor set and the same inverse CDF, but the GPU's
// expf (2 ulp) and its sums (f32 per thread then f64 in the cut searches, f64 in the
// draw) differ from the CPU's in the last bits, so a draw that lands within ~1e-6
// (relative) of a survivor boundary can pick the neighbour, and a top-p threshold within
// ~1e-6 of a cumulative boundary can keep one token more or less.
//
// Raw pointers + cudaStream_t only: kernels/ includes no Abseil or engine header.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace kvmesh::kernels {

// Bytes of device scratch LaunchSampleTopKTopP needs: 0 today (each row's search state
// lives in its CTA's shared memory). The parameter keeps the launcher's signature stable
// for a variant that splits a row over several CTAs.
size_t SampleTopKTopPWorkspaceBytes(int64_t num_rows, int64_t vocab);

// All arrays in device memory:
//   logits:      [num_rows, vocab] f32
//   temperature: [num_rows] f32, finite; < 1e-5 (or NaN) means greedy
//   top_k:       [num_rows] int32; <= 0 or >= vocab: off
//   top_p:       [num_rows] f32 in (0, 1]; >= 1 (or NaN): off; <= 0 keeps the top token only
//   seeds:       [num_rows] uint64, the row's Philox key
//   offsets:     [num_rows] uint64, the row's Philox counter: advance it every step so a
//                seeded row draws a fresh number each step (any distinct value will do)
//   out_ids:     [num_rows] int32, the chosen token id; -1 for a row whose logits are all
//                NaN or -inf (the sampler's "no token has a finite logit")
//   workspace:   SampleTopKTopPWorkspaceBytes(num_rows, vocab) bytes (may be null when 0)
// cudaErrorInvalidValue for num_rows < 0, vocab <= 0 or vocab > 2^31 - 1, num_rows >
// 2^31 - 1, a null array, or workspace_bytes below what is needed; errors of the launch
// otherwise. Asynchronous on `stream`.
cudaError_t LaunchSampleTopKTopP(const float* logits, int64_t num_rows, int64_t vocab, const float* temperature,
                                 const int32_t* top_k, const float* top_p, const uint64_t* seeds,
                                 const uint64_t* offsets, int32_t* out_ids, void* workspace, size_t workspace_bytes,
                                 cudaStream_t stream);

}  // namespace kvmesh::kernels
