#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "argmax/argmax.h"
#include "backend/internal/block_pools.h"
#include "backend/internal/linear_parts.h"
#include "bias_add/bias_add.h"
#include "block_tables/block_tables.h"
#include "cast/cast.h"
#include "copy_blocks/copy_blocks.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "dense_attention/dense_attention.h"
#include "embedding/embedding.h"
#include "gather_rows/gather_rows.h"
#include "paged_attention_decode/paged_attention_decode.h"
#include "paged_attention_prefill/paged_attention_prefill.h"
#include "reshape_and_cache/reshape_and_cache.h"
#include "rms_norm/rms_norm.h"
#include "rope/rope.h"
#include "silu_and_mul/silu_and_mul.h"
#include "swap_blocks/swap_blocks.h"

namespace kvmesh::backend::cuda {
namespace {

// cuBLAS's workspace, set once so that it never allocates (e.g. inside a graph capture).
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
// FP8 scale arrays hold this many KV heads (a model's per-rank KV heads are far fewer).
constexpr int32_t kMaxKvHeads = 1024;

const char* CublasName(cublasStatus_t s) { return cublasGetStatusName(s); }

// A linear layer's weight on the device: [N, K] row-major in its own dtype, bias [N] f32.
class CudaPackedLinear : public PackedLinear {
 public:
  CudaPackedLinear(int64_t n, int64_t k, DType dtype, int64_t num_bytes, DeviceMemory weight, DeviceMemory bias)
      : n_(n), k_(k), dtype_(dtype), num_bytes_(num_bytes), weight_(std::move(weight)), bias_(std::move(bias)) {}
  int64_t out_features() const override { return n_; }
  int64_t in_features() const override { return k_; }
  DType dtype() const override { return dtype_; }
  int64_t num_bytes() const override { return num_bytes_; }
  const void* weight() const { return weight_.get(); }
  const float* bias() const { return bias_.bytes() > 0 ? bias_.as<float>() : nullptr; }

 private:
  const int64_t n_, k_;
  const DType dtype_;
  const int64_t num_bytes_;
  DeviceMemory weight_;
  DeviceMemory bias_;
};

kernels::KvCacheDType KvDType(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return kernels::KvCacheDType::kBf16;
    case DType::kFP8E4M3: return kernels::KvCacheDType::kFp8E4M3;
    default: return kernels::KvCacheDType::kF32;
  }
}

kernels::EmbeddingDType EmbeddingType(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return kernels::EmbeddingDType::kBf16;
    case DType::kF16: return kernels::EmbeddingDType::kF16;
    default: return kernels::EmbeddingDType::kF32;
  }
}

kernels::BlockPoolShape ShapeOf(const Backend::BlockPool& pool) {
  return {.num_layers = pool.num_layers, .layer_bytes = pool.layer_bytes, .block_bytes = pool.block_bytes};
}

// Whether kernels on the current device can read and write `p` at that same address:
// device or managed memory, or pinned host memory mapped into the device's address space
// (cudaHostAlloc under UVA, cudaHostRegister'ed and mapped). Pageable host memory cannot.
bool DeviceAddressable(const void* p) {
  cudaPointerAttributes attributes{};
  const bool known = cudaPointerGetAttributes(&attributes, p) == cudaSuccess;
  (void)cudaGetLastError();  // an unregistered pointer is not an error to keep
  if (!known) return false;
  switch (attributes.type) {
    case cudaMemoryTypeDevice:
    case cudaMemoryTypeManaged: return true;
    case cudaMemoryTypeHost: return attributes.devicePointer == p;
    default: return false;
  }
}

// A Buffer of device memory.
class DeviceBuffer final : public Backend::Buffer {
 public:
  DeviceBuffer(DeviceMemory memory, int64_t size_bytes) : memory_(std::move(memory)), size_bytes_(size_bytes) {}
  std::byte* data() const override { return memory_.as<std::byte>(); }
  int64_t size_bytes() const override { return size_bytes_; }

 private:
  DeviceMemory memory_;
  const int64_t size_bytes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const CudaBackendOptions& options) {
  int count = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device can be used here: ", cudaGetErrorString(err), " (--device cuda needs a GPU)"));
  }
  if (count == 0) return absl::FailedPreconditionError("no CUDA device found (--device cuda needs a GPU)");
  if (options.device < 0 || options.device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", options.device, " does not exist (", count, " device(s))"));
  }
  std::unique_ptr<CudaBackend> be(new CudaBackend());
  be->device_ = options.device;
  KVMESH_RETURN_IF_CUDA_ERROR(cudaSetDevice(options.device), "cudaSetDevice");
  cudaDeviceProp prop{};
  KVMESH_RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&prop, options.device), "cudaGetDeviceProperties");
  be->name_ = absl::StrCat("cuda:", options.device, " (", prop.name, ", sm_", prop.major, prop.minor, ")");
  KVMESH_RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&be->stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  if (const cublasStatus_t s = cublasCreate(&be->cublas_); s != CUBLAS_STATUS_SUCCESS) {
    be->cublas_ = nullptr;
    return absl::InternalError(absl::StrCat("cublasCreate: ", CublasName(s)));
  }
  KVMESH_ASSIGN_OR_RETURN(be->cublas_workspace_, AllocateDevice(kCublasWorkspaceBytes, "the cuBLAS workspace"));
  if (cublasSetStream(be->cublas_, be->stream_) != CUBLAS_STATUS_SUCCESS ||
      cublasSetWorkspace(be->cublas_, be->cublas_workspace_.get(), kCublasWorkspaceBytes) != CUBLAS_STATUS_SUCCESS ||
      // f32 GEMMs stay f32 (no TF32), so f32 models match the CPU backends.
      cublasSetMathMode(be->cublas_, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError("configuring the cuBLAS handle failed");
  }
  const std::vector<float> ones(kMaxKvHeads, 1.0f);
  KVMESH_RETURN_IF_ERROR(be->SetFp8KvScales(ones, ones));
  return be;
}

CudaBackend::~CudaBackend() {
  // The destroying thread may be on another GPU (a tensor-parallel group's teardown).
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaBackend::TakeError() { return std::exchange(error_, absl::OkStatus()); }

void CudaBackend::RecordError(absl::Status status) {
  if (!status.ok() && error_.ok()) error_ = std::move(status);
}

void CudaBackend::RecordError(cudaError_t err, absl::string_view what) {
  if (err != cudaSuccess && error_.ok()) error_ = CudaStatus(err, what);
}

bool CudaBackend::EnsureScratch(size_t bytes, DeviceMemory& scratch, absl::string_view what) {
  if (scratch.bytes() >= bytes) return true;
  absl::StatusOr<DeviceMemory> grown = AllocateDevice(bytes, what);
  if (!grown.ok()) {
    if (error_.ok()) error_ = grown.status();
    return false;
  }
  // The old buffer may still be read by queued work: let it finish before freeing it.
  cudaStreamSynchronize(stream_);
  scratch = std::move(grown).value();
  return true;
}

absl::Status CudaBackend::ReserveWorkspace(const WorkspaceLimits& limits) {
  // NOTE: EnsureScratch records its failure as error_; a failure found here is this call's
  // to return (ops.h, clause 3), so an error already pending is set aside meanwhile.
  absl::Status pending = std::exchange(error_, absl::OkStatus());
  EnsureScratch(static_cast<size_t>(limits.max_tokens * limits.max_width) * sizeof(uint16_t), cast_scratch_,
                "GEMM operands");
  kernels::PagedAttentionDecodeArgs args;
  args.num_seqs = static_cast<int32_t>(limits.max_seqs);
  args.num_heads = limits.num_heads;
  args.num_kv_heads = limits.num_kv_heads;
  args.head_dim = limits.head_dim;
  args.max_context_len = limits.max_context_len;  // the partials' size depends on these four only
  if (error_.ok()) {
    EnsureScratch(kernels::PagedAttentionDecodeWorkspaceBytes(args), attention_scratch_, "decode attention partials");
  }
  return std::exchange(error_, std::move(pending));
}

absl::Status CudaBackend::SetFp8KvScales(std::span<const float> k_scale, std::span<const float> v_scale) {
  if (k_scale.size() != v_scale.size() || k_scale.empty() || k_scale.size() > kMaxKvHeads)
    return absl::InvalidArgumentError("FP8 KV scales: one K and one V scale per KV head");
  std::vector<float> k(kMaxKvHeads, 1.0f), v(kMaxKvHeads, 1.0f);
  std::copy(k_scale.begin(), k_scale.end(), k.begin());
  std::copy(v_scale.begin(), v_scale.end(), v.begin());
  for (float s : k) {
    if (!(s > 0)) return absl::InvalidArgumentError("FP8 KV scales must be positive");
  }
  for (float s : v) {
    if (!(s > 0)) return absl::InvalidArgumentError("FP8 KV scales must be positive");
  }
  if (k_scale_.get() == nullptr) {
    KVMESH_ASSIGN_OR_RETURN(k_scale_, AllocateDevice(sizeof(float) * kMaxKvHeads, "FP8 K scales"));
    KVMESH_ASSIGN_OR_RETURN(v_scale_, AllocateDevice(sizeof(float) * kMaxKvHeads, "FP8 V scales"));
  }
  KVMESH_RETURN_IF_CUDA_ERROR(cudaMemcpy(k_scale_.get(), k.data(), sizeof(float) * k.size(), cudaMemcpyHostToDevice),
                              "uploading FP8 K scales");
  KVMESH_RETURN_IF_CUDA_ERROR(cudaMemcpy(v_scale_.get(), v.data(), sizeof(float) * v.size(), cudaMemcpyHostToDevice),
                              "uploading FP8 V scales");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PackedLinear>> CudaBackend::PackLinear(std::span<const TensorView> parts,
                                                                      std::span<const TensorView> biases) {
  KVMESH_ASSIGN_OR_RETURN(const internal::LinearPartsInfo info, internal::ValidateLinearParts(parts, biases));
  const int64_t n = info.out_features, k = info.in_features;
  const size_t esize = DTypeSize(info.dtype);
  // Gather the parts' rows (the host views may be strided) into one [N, K] image.
  std::vector<std::byte> image(static_cast<size_t>(n * k) * esize);
  int64_t row0 = 0;
  for (const TensorView& part : parts) {
    const int64_t rows = part.dim(0);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(image.data() + static_cast<size_t>((row0 + r) * k) * esize,
                  static_cast<const std::byte*>(part.data) + static_cast<size_t>(r * part.strides[0]) * esize,
                  static_cast<size_t>(k) * esize);
    }
    row0 += rows;
  }
  KVMESH_ASSIGN_OR_RETURN(DeviceMemory weight, AllocateDevice(image.size(), "a linear layer's weight"));
  KVMESH_RETURN_IF_CUDA_ERROR(cudaMemcpy(weight.get(), image.data(), image.size(), cudaMemcpyHostToDevice),
                              "uploading a linear layer's weight");
  DeviceMemory bias;
  if (!biases.empty()) {
    std::vector<float> host(static_cast<size_t>(n));
    int64_t at = 0;
    for (const TensorView& b : biases) {
      for (int64_t i = 0; i < b.dim(0); ++i) host[static_cast<size_t>(at++)] = LoadAsF32(b.data, b.dtype, i);
    }
    KVMESH_ASSIGN_OR_RETURN(bias, AllocateDevice(sizeof(float) * host.size(), "a linear layer's bias"));
    KVMESH_RETURN_IF_CUDA_ERROR(
        cudaMemcpy(bias.get(), host.data(), sizeof(float) * host.size(), cudaMemcpyHostToDevice),
        "uploading a linear layer's bias");
  }
  return std::unique_ptr<PackedLinear>(
      new CudaPackedLinear(n, k, info.dtype, info.num_bytes, std::move(weight), std::move(bias)));
}

void CudaBackend::Linear(const TensorView& x, const PackedLinear& packed, const TensorView& out) {
  if (Failed()) return;
  const auto& w = static_cast<const CudaPackedLinear&>(packed);
  const int64_t t = x.dim(0), k = w.in_features(), n = w.out_features();
  if (t == 0) return;
  // Row-major out[T, N] = x[T, K] W[N, K]^T is, column-major, out^T (N x T) = W^T' x^T:
  // W read as a K x N column-major matrix (lda K) transposed, x as K x T (ldb K).
  const float alpha = 1.0f, beta = 0.0f;
  const void* b = x.data;
  cudaDataType_t operand_type = CUDA_R_32F;
  if (w.dtype() == DType::kBF16 || w.dtype() == DType::kF16) {
    if (!EnsureScratch(static_cast<size_t>(t * k) * sizeof(uint16_t), cast_scratch_, "GEMM operands")) return;
    uint16_t* narrow = cast_scratch_.as<uint16_t>();
    const bool bf16 = w.dtype() == DType::kBF16;
    RecordError(bf16 ? kernels::LaunchCastF32ToBf16(x.data_as<float>(), t * k, narrow, stream_)
                     : kernels::LaunchCastF32ToF16(x.data_as<float>(), t * k, narrow, stream_),
                "casting a GEMM operand");
    b = narrow;
    operand_type = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  }
  const cublasStatus_t s =
      cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(t), static_cast<int>(k),
                   &alpha, w.weight(), operand_type, static_cast<int>(k), b, operand_type, static_cast<int>(k), &beta,
                   out.data, CUDA_R_32F, static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (s != CUBLAS_STATUS_SUCCESS && error_.ok()) {
    error_ = absl::InternalError(absl::StrCat("cublasGemmEx [", t, ", ", k, "] x [", n, ", ", k, "]^T: ",
                                              CublasName(s)));
    return;
  }
  if (w.bias() != nullptr) {
    RecordError(kernels::LaunchBiasAddF32(out.data_as<float>(), w.bias(), t, n, stream_), "adding a bias");
  }
}

void CudaBackend::Embedding(std::span<const int32_t> ids, const TensorView& table, const TensorView& out) {
  if (Failed()) return;
  RecordError(kernels::LaunchEmbedding(ids.data(), static_cast<int64_t>(ids.size()), table.data,
                                       EmbeddingType(table.dtype), table.dim(0), table.dim(1), out.data_as<float>(),
                                       stream_),
              "embedding");
}

void CudaBackend::EmbeddingShard(std::span<const int32_t> ids, const TensorView& table, int64_t first_id,
                                 const TensorView& out) {
  if (Failed()) return;
  RecordError(kernels::LaunchEmbeddingShard(ids.data(), static_cast<int64_t>(ids.size()), table.data,
                                            EmbeddingType(table.dtype), first_id, table.dim(0), table.dim(1),
                                            out.data_as<float>(), stream_),
              "embedding (vocab shard)");
}

void CudaBackend::RmsNorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) {
  if (Failed()) return;
  const int64_t t = x.dim(0), e = x.dim(1);
  RecordError(weight.dtype == DType::kBF16
                  ? kernels::LaunchRmsNormF32Bf16Weight(x.data_as<float>(), weight.data_as<uint16_t>(), eps, t, e,
                                                        out.data_as<float>(), stream_)
                  : kernels::LaunchRmsNormF32F32Weight(x.data_as<float>(), weight.data_as<float>(), eps, t, e,
                                                       out.data_as<float>(), stream_),
              "RMSNorm");
}

void CudaBackend::AddRmsNorm(const TensorView& residual, const TensorView& x, const TensorView& weight, float eps,
                             const TensorView& out) {
  if (Failed()) return;
  const int64_t t = x.dim(0), e = x.dim(1);
  RecordError(weight.dtype == DType::kBF16
                  ? kernels::LaunchAddRmsNormF32Bf16Weight(residual.data_as<float>(), x.data_as<float>(),
                                                           weight.data_as<uint16_t>(), eps, t, e,
                                                           out.data_as<float>(), stream_)
                  : kernels::LaunchAddRmsNormF32F32Weight(residual.data_as<float>(), x.data_as<float>(),
                                                          weight.data_as<float>(), eps, t, e, out.data_as<float>(),
                                                          stream_),
              "add + RMSNorm");
}

void CudaBackend::ApplyRope(const TensorView& q, const TensorView& k, std::span<const int32_t> positions,
                            std::span<const float> inv_freq) {
  if (Failed()) return;
  RecordError(kernels::LaunchRopeF32(q.data_as<float>(), k.data_as<float>(), positions.data(), inv_freq.data(),
                                     q.dim(0), q.dim(1), k.dim(1), q.dim(2), stream_),
              "RoPE");
}

void CudaBackend::SiluAndMul(const TensorView& gate_up, const TensorView& out) {
  if (Failed()) return;
  RecordError(kernels::LaunchSiluAndMulF32(gate_up.data_as<float>(), gate_up.dim(0), out.dim(1),
                                           out.data_as<float>(), stream_),
              "SiLU and mul");
}

void CudaBackend::DenseAttention(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                                 std::span<const int32_t> positions, float scale, const TensorView& out) {
  if (Failed()) return;
  RecordError(kernels::LaunchDenseAttentionF32(q.data_as<float>(), k_cache.data_as<float>(), v_cache.data_as<float>(),
                                               positions.data(), q.dim(0), q.dim(1), k_cache.dim(1), q.dim(2), scale,
                                               out.data_as<float>(), stream_),
              "dense attention");
}

void CudaBackend::WriteKvCache(const TensorView& k, const TensorView& v, std::span<const int64_t> slots,
                               const TensorView& kv_cache) {
  if (Failed()) return;
  // kv_cache: [num_blocks, 2, Hkv, B, D].
  const kernels::KvCacheShape shape{
      .num_kv_heads = kv_cache.dim(2), .head_dim = kv_cache.dim(4), .block_size_tokens = kv_cache.dim(3)};
  const int64_t t = static_cast<int64_t>(slots.size());
  const float* kp = k.data_as<float>();
  const float* vp = v.data_as<float>();
  cudaError_t err = cudaErrorInvalidValue;
  switch (kv_cache.dtype) {
    case DType::kF32:
      err = kernels::LaunchReshapeAndCacheF32(kp, vp, slots.data(), t, shape, kv_cache.data_as<float>(), stream_);
      break;
    case DType::kBF16:
      err = kernels::LaunchReshapeAndCacheBf16(kp, vp, slots.data(), t, shape, kv_cache.data_as<uint16_t>(), stream_);
      break;
    case DType::kFP8E4M3:
      err = kernels::LaunchReshapeAndCacheFp8(kp, vp, slots.data(), t, shape, k_scale_.as<float>(),
                                              v_scale_.as<float>(), kv_cache.data_as<uint8_t>(), stream_);
      break;
    default: break;
  }
  RecordError(err, absl::StrCat("writing the KV cache (", std::string(DTypeName(kv_cache.dtype)), " pool)"));
}

void CudaBackend::PagedAttention(const TensorView& q, const TensorView& kv_cache, const PagedAttentionBatch& batch,
                                 float scale, const TensorView& out) {
  if (Failed()) return;
  if (batch.max_query_len <= 0 || batch.max_context_len <= 0) {
    RecordError(cudaErrorInvalidValue, "PagedAttention on CUDA needs the batch's max_query_len and max_context_len");
    return;
  }
  // The fields both kernels' arguments share (kv_cache: [num_blocks, 2, Hkv, B, D]).
  auto fill_common = [&](auto& args) {
    args.q = q.data_as<float>();
    args.kv_cache = kv_cache.data;
    args.context_lens = batch.context_lens.data();
    args.block_tables = batch.block_tables.data();
    args.k_scale = k_scale_.as<float>();
    args.v_scale = v_scale_.as<float>();
    args.out = out.data_as<float>();
    args.num_seqs = static_cast<int32_t>(batch.context_lens.size());
    args.num_heads = static_cast<int32_t>(q.dim(1));
    args.num_kv_heads = static_cast<int32_t>(kv_cache.dim(2));
    args.head_dim = static_cast<int32_t>(q.dim(2));
    args.block_size_tokens = static_cast<int32_t>(kv_cache.dim(3));
    args.max_blocks_per_seq = batch.max_blocks_per_seq;
    args.scale = scale;
    args.kv_dtype = KvDType(kv_cache.dtype);
  };
  if (batch.max_query_len == 1) {
    kernels::PagedAttentionDecodeArgs args;
    fill_common(args);
    args.max_context_len = batch.max_context_len;
    const size_t workspace = kernels::PagedAttentionDecodeWorkspaceBytes(args);
    if (!EnsureScratch(workspace, attention_scratch_, "decode attention partials")) return;
    RecordError(
        kernels::LaunchPagedAttentionDecode(args, attention_scratch_.get(), attention_scratch_.bytes(), stream_),
        "paged attention (decode)");
    return;
  }
  kernels::PagedAttentionPrefillArgs args;
  fill_common(args);
  args.query_start = batch.query_start.data();
  args.num_tokens = static_cast<int32_t>(q.dim(0));
  args.max_query_len = batch.max_query_len;
  RecordError(kernels::LaunchPagedAttentionPrefill(args, stream_), "paged attention (prefill)");
}

void CudaBackend::CopyColumns(const TensorView& src, int64_t src_col, const TensorView& dst, int64_t dst_col,
                              int64_t width) {
  if (Failed()) return;
  const int64_t t = src.dim(0);
  if (t == 0 || width == 0) return;
  // Row pitches are the views' row strides (both contiguous: their widths).
  RecordError(cudaMemcpy2DAsync(dst.data_as<float>() + dst_col, static_cast<size_t>(dst.strides[0]) * sizeof(float),
                                src.data_as<const float>() + src_col,
                                static_cast<size_t>(src.strides[0]) * sizeof(float),
                                static_cast<size_t>(width) * sizeof(float), static_cast<size_t>(t),
                                cudaMemcpyDeviceToDevice, stream_),
              "copying columns");
}

void CudaBackend::GatherAddRows(const TensorView& a, const TensorView& b, std::span<const int32_t> rows,
                                const TensorView& out) {
  if (Failed()) return;
  RecordError(kernels::LaunchGatherAddRowsF32(a.data_as<const float>(), b.data_as<const float>(), rows.data(),
                                              static_cast<int64_t>(rows.size()), a.dim(1), out.data_as<float>(),
                                              stream_),
              "gathering and adding rows");
}

void CudaBackend::ArgmaxRows(const TensorView& x, std::span<int32_t> out) {
  if (Failed()) return;
  RecordError(kernels::LaunchArgmaxRows(x.data_as<const float>(), static_cast<int64_t>(out.size()), x.dim(1),
                                        out.data(), stream_),
              "argmax of rows");
}

void CudaBackend::CopyBlocks(const BlockPool& pool, std::span<const int32_t> pairs) {
  if (Failed() || pairs.empty()) return;
  RecordError(kernels::LaunchCopyBlocks(pool.data, ShapeOf(pool), pairs.data(), static_cast<int64_t>(pairs.size() / 2),
                                        stream_),
              "copying KV blocks");
}

void CudaBackend::SwapBlocks(const BlockPool& src, const BlockPool& dst, std::span<const int32_t> pairs) {
  if (Failed() || pairs.empty()) return;
  // The kernel skips a pair it cannot copy without saying so: the host checks them all.
  if (absl::Status checked = internal::CheckBlockCopy(src, dst, pairs); !checked.ok()) {
    RecordError(absl::InvalidArgumentError(absl::StrCat("SwapBlocks: ", checked.message())));
    return;
  }
  const int64_t n = static_cast<int64_t>(pairs.size() / 2);
  // Pinned (cudaHostAlloc) and managed host pools, and pinned pairs, are read and written
  // by the kernel in place; a pageable host pool (a host tier given another allocator) or
  // pageable pairs go through cudaMemcpyAsync, which the kernel's zero-copy cannot replace.
  const bool in_place = DeviceAddressable(src.data) && DeviceAddressable(dst.data) && DeviceAddressable(pairs.data());
  RecordError(in_place ? kernels::LaunchSwapBlocks(src.data, dst.data, ShapeOf(src), ShapeOf(dst), pairs.data(), n,
                                                   stream_)
                       : kernels::LaunchSwapBlocksMemcpy(src.data, dst.data, ShapeOf(src), ShapeOf(dst), pairs.data(),
                                                         n, stream_),
              in_place ? "swapping KV blocks (kernel)" : "swapping KV blocks (cudaMemcpyAsync)");
}

void CudaBackend::ScatterPairs(std::span<const int32_t> updates, std::span<int32_t> array) {
  if (Failed()) return;
  RecordError(kernels::LaunchApplyBlockTableUpdates(updates.data(), static_cast<int64_t>(updates.size() / 2),
                                                    array.data(), stream_),
              "scattering block-table updates");
}

void CudaBackend::GatherTableRows(std::span<const int32_t> rows, int64_t row_stride, std::span<const int32_t> rows_of,
                                  std::span<const int32_t> context_lens, int32_t block_size_tokens,
                                  std::span<int32_t> out) {
  if (Failed() || rows_of.empty()) return;
  const int64_t s = static_cast<int64_t>(rows_of.size());
  RecordError(kernels::LaunchGatherBlockTableRows(rows.data(), row_stride, rows_of.data(), context_lens.data(),
                                                  block_size_tokens, s, static_cast<int64_t>(out.size()) / s,
                                                  out.data(), stream_),
              "gathering block-table rows");
}

absl::StatusOr<std::unique_ptr<Backend::Buffer>> CudaBackend::Allocate(int64_t bytes, std::string_view what) {
  const absl::string_view for_what(what.data(), what.size());
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("Allocate: ", bytes, " bytes for ", for_what));
  absl::StatusOr<DeviceMemory> memory = AllocateDevice(static_cast<size_t>(bytes), for_what);
  if (!memory.ok()) {
    // A failed cudaMalloc is not sticky, but it stays the thread's last error, which the
    // next launcher's cudaGetLastError() would report as its own: clear it here.
    (void)cudaGetLastError();
    return memory.status();
  }
  return std::unique_ptr<Buffer>(new DeviceBuffer(std::move(memory).value(), bytes));
}

}  // namespace kvmesh::backend::cuda

namespace kvmesh::backend {

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device) {
  KVMESH_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaBackend> backend, cuda::CudaBackend::Create({.device = device}));
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace kvmesh::backend
