// Paged KV cache write and paged attention for a mixed batch of prefill chunks
// and decode steps (vLLM varlen style); compiled once per ISA (vec.h).
//
// Work item = (sequence, KV head, up to kMaxQueryVectors / group query rows of
// that sequence): its "query vectors" are every (row, query head) pair of the
// KV head's group, so each K/V tile is fetched from memory once per item and
// applied to all of them (decode: the whole GQA group of one token). Items are
// ordered heaviest first and handed out dynamically, so a long prefill chunk is
// spread over all threads rather than serialised behind one.
//
// Reduction order (what batch invariance rests on). Keys are taken in tiles of
// `tile` positions, [j * tile, (j + 1) * tile): whole blocks (tile = B *
// ceil(32 / B), or B when B >= 32), in ascending position order. For every
// query vector (fixed position p) the sequence of f32 operations is fixed by p,
// the tile size and the K/V values alone:
//  1. score(p, s) = (FMA chain over c = 0..D-1 of q[c] * k_s[c]) * scale, for
//     s in the tile and s <= p; the others are -inf;
//  2. m' = max(m, max of the tile's scores); probabilities e = Exp(score - m')
//     stored per key; l' = fma(l, Exp(m - m'), sum) where sum adds the tile's
//     probabilities in vector chunks of kLanes keys (then ReduceAdd);
//  3. acc[c] = acc[c] * Exp(m - m'), then acc[c] = fma(e_s, v_s[c], acc[c]) for
//     the tile's visible keys s in ascending order;
//  4. out = acc * (1 / l) after the last tile.
// Which other query vectors share the item, its row in the batch and the thread
// count change only which of them are computed together, never these operations,
// so a token's output is bitwise the same alone, in any batch and however its
// prompt was chunked. (Results differ between the AVX-512 and AVX2 builds.)
//
// Scores want K dimension-major ([D, keys], so that one vector holds kLanes
// keys' partial dots, with no horizontal sums), which is how the cache stores a
// block's K (kv/kv_layout.h): when B is a multiple of kLanes the score kernel
// reads each chunk of kLanes keys straight from its block (row stride B);
// otherwise the tile's keys are first gathered into scratch [D, tile]. Both
// give the same operations, hence the same bits. P.V keeps the accumulators of
// up to kPvRows query vectors in registers (V is token-major). Scratch is
// thread-local and grow-only: no heap allocation per call once warm.
#include <omp.h>

#include <cstdint>
#include <cstdlib>

#include "backend/cpu/kernels_isa.h"
#include "core/dtype.h"

namespace kvmesh::backend::cpu::KVMESH_CPU_ISA {
namespace {

constexpr int64_t kMinTileTokens = 32;  // a tile is the fewest whole blocks holding >= this many keys
constexpr int kMaxQueryVectors = 32;    // (row, head) pairs per work item
constexpr int64_t kPrefetchTiles = 1;  // how far ahead K/V tiles are prefetched
constexpr int kQkRows = 4;              // query vectors per pass of the score kernel
#if defined(KVMESH_CPU_AVX512)
constexpr int kPvRows = 6;  // query vectors whose accumulators stay in registers
constexpr int kPvVecs = 4;  // vectors of head_dim per P.V pass
#else
constexpr int kPvRows = 4;
constexpr int kPvVecs = 2;
#endif

// A grow-only 64-byte-aligned buffer, one per thread.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { std::free(data_); }

  void* Get(int64_t bytes) {
    if (bytes > capacity_) {
      std::free(data_);
      capacity_ = (bytes + 4095) / 4096 * 4096;
      data_ = std::aligned_alloc(64, static_cast<size_t>(capacity_));
      if (data_ == nullptr) std::abort();
    }
    return data_;
  }

 private:
  void* data_ = nullptr;
  int64_t capacity_ = 0;
};

thread_local Scratch tls_item_scratch;  // per worker thread: one item's tiles and state
thread_local Scratch tls_plan_scratch;  // calling thread: the work item list

KVMESH_VEC_INLINE int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

KVMESH_VEC_INLINE float FirstLane(V a) {
  alignas(64) float lanes[kLanes];
  Store(lanes, a);
  return lanes[0];
}

// Lane i holds i.
KVMESH_VEC_INLINE V Iota() {
  alignas(64) static constexpr float kIota[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return Load(kIota);
}

// ---- KV elements: f32, or bf16 (uint16_t bits) widened exactly to f32 on load.
KVMESH_VEC_INLINE V LoadKv(const float* p) { return Load(p); }
KVMESH_VEC_INLINE V LoadKv(const uint16_t* p) { return LoadBf16(p); }
KVMESH_VEC_INLINE float KvToF32(float x) { return x; }
KVMESH_VEC_INLINE float KvToF32(uint16_t x) { return __builtin_bit_cast(float, static_cast<uint32_t>(x) << 16); }

// ---- K gather for block sizes that are not a multiple of kLanes:
// kt[c * ldk + j] = K of key j, dimension c, for j < n (keys[j] -> its block's K
// head at its offset; the block's K is [D][B], row stride bs).
template <typename T>
KVMESH_VEC_INLINE void GatherKeys(const T* const* keys, int64_t n, int64_t d, int64_t bs, float* kt, int64_t ldk) {
  for (int64_t c = 0; c < d; ++c) {
    for (int64_t j = 0; j < n; ++j) kt[c * ldk + j] = KvToF32(keys[j][c * bs]);
  }
}

// ---- Scores: R query vectors x NC chunks of kLanes keys, one FMA chain over c each.
// Chunk i's keys are kchunks[i][c * ldk + lane] (dimension-major).
// scores[r][j * kLanes + lane] = dot * scale, or -inf where the key index >= visible[r].
template <int R, int NC, typename T>
KVMESH_VEC_INLINE void ScoreBlock(const float* const* q, const T* const* kchunks, int64_t ldk, int64_t d,
                                  int64_t chunk0, const int32_t* visible, float scale, float* scores,
                                  int64_t ld_scores) {
  V acc[R][NC];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NC; ++j) acc[r][j] = Zero();
  }
  const T* k[NC];
  for (int j = 0; j < NC; ++j) k[j] = kchunks[chunk0 + j];
  for (int64_t c = 0; c < d; ++c) {
    V kv[NC];
    for (int j = 0; j < NC; ++j) kv[j] = LoadKv(k[j] + c * ldk);
    for (int r = 0; r < R; ++r) {
      const V qb = Set1(q[r][c]);
      for (int j = 0; j < NC; ++j) acc[r][j] = Fma(qb, kv[j], acc[r][j]);
    }
  }
  const V sv = Set1(scale);
  const V neg_inf = Set1(-__builtin_inff());
  const V iota = Iota();
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NC; ++j) {
      const int64_t key0 = (chunk0 + j) * kLanes;
      const V limit = Set1(static_cast<float>(visible[r] - key0));
      Store(scores + r * ld_scores + key0, SelectLess(iota, limit, neg_inf, Mul(acc[r][j], sv)));
    }
  }
}

template <int R, typename T>
void Scores(const float* const* q, const T* const* kt, int64_t ldk, int64_t d, int64_t num_chunks,
            const int32_t* visible, float scale, float* scores, int64_t ld_scores) {
  int64_t chunk = 0;
  for (; chunk + 2 <= num_chunks; chunk += 2) {
    ScoreBlock<R, 2, T>(q, kt, ldk, d, chunk, visible, scale, scores, ld_scores);
  }
  if (chunk < num_chunks) ScoreBlock<R, 1, T>(q, kt, ldk, d, chunk, visible, scale, scores, ld_scores);
}

template <typename T>
void ScoresAny(int r, const float* const* q, const T* const* kt, int64_t ldk, int64_t d, int64_t num_chunks,
               const int32_t* visible, float scale, float* scores, int64_t ld_scores) {
  static_assert(kQkRows == 4);
  switch (r) {
    case 1: return Scores<1, T>(q, kt, ldk, d, num_chunks, visible, scale, scores, ld_scores);
    case 2: return Scores<2, T>(q, kt, ldk, d, num_chunks, visible, scale, scores, ld_scores);
    case 3: return Scores<3, T>(q, kt, ldk, d, num_chunks, visible, scale, scores, ld_scores);
    default: return Scores<4, T>(q, kt, ldk, d, num_chunks, visible, scale, scores, ld_scores);
  }
}

// ---- P.V: for R query vectors and NV vectors of head_dim starting at c0:
// acc = acc * correction, then acc = fma(p[s], v_s, acc) for s in [0, num_keys).
template <typename T>
struct PvArgs {
  float* const* acc;          // [R] -> accumulator row (head_dim floats)
  const float* correction;    // [R]
  const float* const* probs;  // [R] -> probabilities of the keys
  const T* const* vrows;      // [num_keys] -> V rows
  int64_t num_keys;
  int64_t c0;
};

template <int R, int NV, typename T>
KVMESH_VEC_INLINE void PvBlock(const PvArgs<T>& a) {
  V acc[R][NV];
  for (int r = 0; r < R; ++r) {
    const V corr = Set1(a.correction[r]);
    for (int v = 0; v < NV; ++v) acc[r][v] = Mul(Load(a.acc[r] + a.c0 + v * kLanes), corr);
  }
  for (int64_t s = 0; s < a.num_keys; ++s) {
    const T* vrow = a.vrows[s] + a.c0;
    V x[NV];
    for (int v = 0; v < NV; ++v) x[v] = LoadKv(vrow + v * kLanes);
    for (int r = 0; r < R; ++r) {
      const V p = Set1(a.probs[r][s]);
      for (int v = 0; v < NV; ++v) acc[r][v] = Fma(p, x[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < NV; ++v) Store(a.acc[r] + a.c0 + v * kLanes, acc[r][v]);
  }
}

template <int R, int NV, typename T>
void PvVecs(int nv, const PvArgs<T>& a) {
  if constexpr (NV > 1) {
    if (nv < NV) return PvVecs<R, NV - 1, T>(nv, a);
  }
  PvBlock<R, NV, T>(a);
}

template <int R, typename T>
void PvAny(int r, int nv, const PvArgs<T>& a) {
  if constexpr (R > 1) {
    if (r < R) return PvAny<R - 1, T>(r, nv, a);
  }
  PvVecs<R, kPvVecs, T>(nv, a);
}

// Runs P.V over all of head_dim for r (<= kPvRows) query vectors.
template <typename T>
void Pv(int r, float* const* acc, const float* correction, const float* const* probs, const T* const* vrows,
        int64_t num_keys, int64_t d) {
  for (int64_t c0 = 0; c0 < d; c0 += kPvVecs * kLanes) {
    const int nv = static_cast<int>(Min<int64_t>(kPvVecs, (d - c0) / kLanes));
    PvAny<kPvRows, T>(r, nv, PvArgs<T>{acc, correction, probs, vrows, num_keys, c0});
  }
}

// ---- Work items.

struct WorkItem {
  int64_t cost;  // ~ query vectors x keys attended
  int32_t seq;
  int32_t row0;   // first query row, relative to the sequence's chunk
  int32_t rows;
  int32_t head0;  // first query head
  int32_t heads;  // query heads (all of one KV head's group, or a slice of it)
};

// Shell sort, heaviest first (ties by position in the list, so the order is fixed).
void SortByCostDescending(WorkItem* items, int64_t n) {
  static constexpr int64_t kGaps[] = {701, 301, 132, 57, 23, 10, 4, 1};
  for (int64_t gap : kGaps) {
    for (int64_t i = gap; i < n; ++i) {
      const WorkItem x = items[i];
      int64_t j = i;
      for (; j >= gap && items[j - gap].cost < x.cost; j -= gap) items[j] = items[j - gap];
      items[j] = x;
    }
  }
}

int64_t TileTokens(int64_t block_size) {
  return block_size >= kMinTileTokens ? block_size : block_size * CeilDiv(kMinTileTokens, block_size);
}

// T: the cache's element type (float, or uint16_t for bf16).
template <typename T>
void ProcessItem(const PagedAttentionParams& p, const WorkItem& item) {
  const int64_t d = p.d;
  const int64_t bs = p.block_size;
  const int64_t group = p.h / p.hkv;
  const int64_t kvh = item.head0 / group;
  const int64_t tile = TileTokens(bs);
  const int64_t ld = CeilDiv(tile, kLanes) * kLanes;  // padded tile width
  const int64_t q_row0 = p.query_start[item.seq];
  const int64_t n = p.query_start[item.seq + 1] - q_row0;
  const int64_t first_pos = static_cast<int64_t>(p.context_lens[item.seq]) - n + item.row0;  // of the item's row 0
  const int64_t last_pos = first_pos + item.rows - 1;
  const int nq = item.rows * item.heads;

  // K chunks come straight from the cache when every chunk of kLanes keys lies in
  // one block; otherwise they are gathered into kt.
  const bool direct_k = bs % kLanes == 0;
  // Scratch: kt [d, ld] | scores [kMaxQueryVectors, ld] | acc [kMaxQueryVectors, d] | key, V row, cache K
  // chunk and kt chunk pointers (ld each, so the two chunk lists never share storage).
  float* kt = static_cast<float*>(
      tls_item_scratch.Get((d * ld + kMaxQueryVectors * ld + kMaxQueryVectors * d) * 4 + 4 * ld * 8));
  float* scores = kt + d * ld;
  float* acc_base = scores + kMaxQueryVectors * ld;
  const T** kptr = reinterpret_cast<const T**>(acc_base + kMaxQueryVectors * d);
  const T** vptr = kptr + ld;
  const T** kchunk = vptr + ld;                                         // direct_k: chunks in the cache
  const float** kt_chunk = reinterpret_cast<const float**>(kchunk + ld);  // !direct_k: chunks of kt
  if (!direct_k) {
    for (int64_t i = 0; i < ld / kLanes; ++i) kt_chunk[i] = kt + i * kLanes;
  }

  const float* qv[kMaxQueryVectors];
  float* accv[kMaxQueryVectors];
  const float* probs[kMaxQueryVectors];
  int64_t pos[kMaxQueryVectors];
  int32_t visible[kMaxQueryVectors];
  float row_max[kMaxQueryVectors];
  float row_sum[kMaxQueryVectors];
  float correction[kMaxQueryVectors];
  static constexpr float kOne[kMaxQueryVectors] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                                     1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  for (int i = 0; i < nq; ++i) {
    const int64_t r = i / item.heads;
    const int64_t hh = item.head0 + i % item.heads;
    qv[i] = p.q + ((q_row0 + item.row0 + r) * p.h + hh) * d;
    accv[i] = acc_base + i * d;
    probs[i] = scores + i * ld;
    pos[i] = first_pos + r;
    row_max[i] = -__builtin_inff();
    row_sum[i] = 0.0f;
    for (int64_t c = 0; c < d; c += kLanes) Store(accv[i] + c, Zero());
  }

  const int32_t* table = p.block_tables + item.seq * p.max_blocks_per_seq;
  const int64_t head_stride = bs * d;
  const T* cache = static_cast<const T*>(p.kv_cache);
  const T* k_base = cache + kvh * head_stride;
  const T* v_base = cache + (p.hkv + kvh) * head_stride;
  const int64_t block_stride = 2 * p.hkv * head_stride;

  for (int64_t t0 = 0; t0 <= last_pos; t0 += tile) {
    const int64_t num_keys = Min(tile, last_pos + 1 - t0);
    const int64_t num_chunks = CeilDiv(num_keys, kLanes);
    // Key pointers (K: the key's column of its block's [D][B] K; V: its row);
    // padding past num_keys repeats the last key (finite, masked). A tile is whole
    // blocks (t0 % bs == 0), so keys are walked block by block without a division
    // per key.
    {
      const int32_t* tile_blocks = table + t0 / bs;
      for (int64_t s0 = 0; s0 < num_keys; s0 += bs) {
        const int64_t off = static_cast<int64_t>(tile_blocks[s0 / bs]) * block_stride;
        const int64_t n_in = Min(bs, num_keys - s0);
        for (int64_t j = 0; j < n_in; ++j) {
          kptr[s0 + j] = k_base + off + j;
          vptr[s0 + j] = v_base + off + j * d;
        }
        if (direct_k) {
          // Lanes past n_in read the block's unused slots: finite or not, they are masked.
          for (int64_t j = 0; j < n_in; j += kLanes) kchunk[(s0 + j) / kLanes] = k_base + off + j;
        }
      }
      for (int64_t s = num_keys; s < num_chunks * kLanes; ++s) {
        kptr[s] = kptr[num_keys - 1];
        vptr[s] = vptr[num_keys - 1];
      }
    }
    // Prefetch K and V kPrefetchTiles tiles ahead while this one is computed.
    if (t0 + kPrefetchTiles * tile <= last_pos) {
      const int64_t ahead = t0 + kPrefetchTiles * tile;
      const int64_t next_keys = Min(tile, last_pos + 1 - ahead);
      const int32_t* next_blocks = table + ahead / bs;
      for (int64_t s0 = 0; s0 < next_keys; s0 += bs) {
        const int64_t off = static_cast<int64_t>(next_blocks[s0 / bs]) * block_stride;
        // K of a block head is [D][B] (read whole); V rows are contiguous.
        const int64_t k_bytes = bs * d * static_cast<int64_t>(sizeof(T));
        const int64_t v_bytes = Min(bs, next_keys - s0) * d * static_cast<int64_t>(sizeof(T));
        const char* kb = reinterpret_cast<const char*>(k_base + off);
        const char* vb = reinterpret_cast<const char*>(v_base + off);
        for (int64_t b = 0; b < k_bytes; b += 64) Prefetch(kb + b);
        for (int64_t b = 0; b < v_bytes; b += 64) Prefetch(vb + b);
      }
    }
    if (!direct_k) GatherKeys(kptr, num_chunks * kLanes, d, bs, kt, ld);
    // Query vectors are ordered by row, so those that see this tile are a suffix.
    const int first = static_cast<int>(Max<int64_t>(0, t0 - first_pos) * item.heads);
    for (int i = first; i < nq; ++i) visible[i] = static_cast<int32_t>(Min(num_keys, pos[i] - t0 + 1));
    for (int i = first; i < nq; i += kQkRows) {
      const int r = Min(kQkRows, nq - i);
      if (direct_k) {
        ScoresAny<T>(r, qv + i, kchunk, bs, d, num_chunks, visible + i, p.scale, scores + i * ld, ld);
      } else {
        ScoresAny<float>(r, qv + i, kt_chunk, ld, d, num_chunks, visible + i, p.scale, scores + i * ld, ld);
      }
    }
    // Online softmax: the tile's max, probabilities in place, running sum.
    for (int i = first; i < nq; ++i) {
      float* sc = scores + i * ld;
      const int64_t chunks = CeilDiv(visible[i], kLanes);
      V mx = Load(sc);
      for (int64_t j = 1; j < chunks; ++j) mx = Max(mx, Load(sc + j * kLanes));
      const float m_new = Max(row_max[i], ReduceMax(mx));
      const V mv = Set1(m_new);
      V sum = Zero();
      for (int64_t j = 0; j < chunks; ++j) {
        const V e = Exp(Sub(Load(sc + j * kLanes), mv));
        Store(sc + j * kLanes, e);
        sum = Add(sum, e);
      }
      correction[i] = row_max[i] == m_new ? 1.0f : FirstLane(Exp(Set1(row_max[i] - m_new)));
      row_sum[i] = __builtin_fmaf(row_sum[i], correction[i], ReduceAdd(sum));
      row_max[i] = m_new;
    }
    // P.V in register groups over the keys all of them see, then each one's own rest.
    for (int i = first; i < nq; i += kPvRows) {
      const int r = Min(kPvRows, nq - i);
      int64_t common = visible[i];
      for (int j = 1; j < r; ++j) common = Min<int64_t>(common, visible[i + j]);
      Pv<T>(r, accv + i, correction + i, probs + i, vptr, common, d);
      for (int j = 0; j < r; ++j) {
        if (visible[i + j] > common) {
          const float* rest = probs[i + j] + common;
          Pv<T>(1, accv + i + j, kOne, &rest, vptr + common, visible[i + j] - common, d);
        }
      }
    }
  }

  for (int i = 0; i < nq; ++i) {
    const int64_t r = i / item.heads;
    const int64_t hh = item.head0 + i % item.heads;
    float* o = p.out + ((q_row0 + item.row0 + r) * p.h + hh) * d;
    const V inv = Set1(1.0f / row_sum[i]);
    for (int64_t c = 0; c < d; c += kLanes) Store(o + c, Mul(Load(accv[i] + c), inv));
  }
}

}  // namespace

namespace {

KVMESH_VEC_INLINE void StoreKvElement(float* dst, float x) { *dst = x; }
KVMESH_VEC_INLINE void StoreKvElement(uint16_t* dst, float x) { *dst = F32ToBf16(x); }

template <typename T>
void WriteKvCacheOf(const float* k, const float* v, int64_t t, const int64_t* slots, T* cache, int64_t hkv, int64_t b,
                    int64_t d, int num_threads) {
  // A decode step's handful of rows is cheaper than waking the team.
  const int threads = t * hkv * d < (1 << 16) ? 1 : num_threads;
  const int64_t head_stride = b * d;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < t; ++i) {
    const int64_t block = slots[i] / b;
    const int64_t offset = slots[i] % b;
    // K: [Hkv][D][B] per block, so the token's dimensions are B apart.
    const float* ks = k + i * hkv * d;
    T* kdst = cache + block * 2 * hkv * head_stride + offset;
    for (int64_t hh = 0; hh < hkv; ++hh) {
      for (int64_t c = 0; c < d; ++c) StoreKvElement(kdst + hh * head_stride + c * b, ks[hh * d + c]);
    }
    // V: [Hkv][B][D], one contiguous row per token and head.
    const float* vs = v + i * hkv * d;
    T* vdst = cache + (block * 2 + 1) * hkv * head_stride + offset * d;
    for (int64_t hh = 0; hh < hkv; ++hh) {
      const float* src = vs + hh * d;
      T* o = vdst + hh * head_stride;
      if constexpr (sizeof(T) == 4) {
        int64_t c = 0;
        for (; c + kLanes <= d; c += kLanes) Store(o + c, Load(src + c));
        if (c < d) StorePartial(o + c, LoadPartial(src + c, static_cast<int>(d - c)), static_cast<int>(d - c));
      } else {
        for (int64_t c = 0; c < d; ++c) StoreKvElement(o + c, src[c]);
      }
    }
  }
}

}  // namespace

void WriteKvCache(const float* k, const float* v, int64_t t, const int64_t* slots, void* cache, bool bf16,
                  int64_t hkv, int64_t b, int64_t d, int num_threads) {
  if (bf16) {
    WriteKvCacheOf(k, v, t, slots, static_cast<uint16_t*>(cache), hkv, b, d, num_threads);
  } else {
    WriteKvCacheOf(k, v, t, slots, static_cast<float*>(cache), hkv, b, d, num_threads);
  }
}

void PagedAttention(const PagedAttentionParams& p, int num_threads) {
  const int64_t group = p.h / p.hkv;
  const int64_t heads_per_item = Min<int64_t>(group, kMaxQueryVectors);
  const int64_t head_chunks = CeilDiv(group, heads_per_item);
  const int64_t rows_per_item = Max<int64_t>(1, kMaxQueryVectors / heads_per_item);
  int64_t num_items = 0;
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    num_items += CeilDiv(p.query_start[s + 1] - p.query_start[s], rows_per_item) * p.hkv * head_chunks;
  }
  if (num_items == 0) return;
  WorkItem* items = static_cast<WorkItem*>(tls_plan_scratch.Get(num_items * static_cast<int64_t>(sizeof(WorkItem))));
  int64_t total_cost = 0;
  int64_t count = 0;
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const int64_t n = p.query_start[s + 1] - p.query_start[s];
    const int64_t first_pos = static_cast<int64_t>(p.context_lens[s]) - n;
    for (int64_t row0 = 0; row0 < n; row0 += rows_per_item) {
      const int64_t rows = Min(rows_per_item, n - row0);
      for (int64_t kvh = 0; kvh < p.hkv; ++kvh) {
        for (int64_t hc = 0; hc < head_chunks; ++hc) {
          const int64_t head0 = kvh * group + hc * heads_per_item;
          const int64_t heads = Min(heads_per_item, (kvh + 1) * group - head0);
          // Keys of the item's last row (the tile loop's length) x query vectors, plus a fixed overhead.
          const int64_t cost = (first_pos + row0 + rows) * (rows * heads + 4) + 64;
          items[count++] = WorkItem{cost, static_cast<int32_t>(s), static_cast<int32_t>(row0),
                                    static_cast<int32_t>(rows), static_cast<int32_t>(head0),
                                    static_cast<int32_t>(heads)};
          total_cost += cost;
        }
      }
    }
  }
  SortByCostDescending(items, count);
  // A lone short decode stays on this thread.
  const int threads = total_cost * p.d < (1 << 17) ? 1 : static_cast<int>(Min<int64_t>(num_threads, count));
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < count; ++i) {
    if (p.kv_bf16) {
      ProcessItem<uint16_t>(p, items[i]);
    } else {
      ProcessItem<float>(p, items[i]);
    }
  }
}

}  // namespace kvmesh::backend::cpu::KVMESH_CPU_ISA
