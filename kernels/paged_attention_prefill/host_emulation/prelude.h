// Host emulation of the prefill kernel, for tests on machines without a GPU: the kernel's own
// source (paged_attention_prefill_kernel.cuh) compiled by the host compiler, one std::thread
// per CUDA thread, CUDA's built-ins replaced by kernels/host_emulation/prelude.h and the
// warp-collective PTX wrappers (mma_bf16.cuh) by emulations that follow the PTX ISA's
// fragment layouts.
//
// How a test uses it: this folder comes first on the include path (so its
// paged_attention_prefill/mma_bf16.cuh shadows the real one), this header is the translation
// unit's first include (before any CUDA header), and emulated_launch.h runs a launch. What it
// checks: indexing, paging, masking, the online softmax, the fragment bookkeeping, barrier
// placement (each cp.async lands only at its wait_group; shared memory starts as garbage).
// What it cannot: the hardware's own semantics (it trusts its reading of the PTX ISA), timing,
// bank conflicts, registers.
#pragma once

#include "host_emulation/prelude.h"

// The prefill kernel's one shared array is `extern __shared__` (dynamic): a plain array
// here (emulated_launch.h defines it), poisoned before each CTA by EmulateGrid.
#undef __shared__
#define __shared__
