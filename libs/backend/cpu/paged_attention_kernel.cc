// Paged KV cache write and paged attention for a mixed batch of prefill chunks
// and decode steps (vLLM varlen style); compiled once per ISA (vec.h).
//
// Work item = (sequence, KV head, up to kMaxQueryVectors / group query rows of
// that sequence): its "query vectors" are every (row, query head) pair of the
// KV head's group, so each K/V tile is fetched from memory once per item and
// applied to all of them. A decode row (one query row) whose query heads all fit
// (H <= kMaxQueryVectors) is one item over every KV head instead: per tile, each
// KV head's keys against its own group, so a block's whole K and V (all heads, one
// contiguous run) are read together; scattered blocks then stream 7-13% faster from
// DRAM than one head's 2 KB pieces at a time (paged_attention_bench, bf16 SmolLM2
// shape, batch 16/64 x 8k context). Items are ordered heaviest first and handed out
// dynamically, so a long prefill chunk is spread over all threads rather than
// serialised behind one.
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
//  4. Steps 1-3 run separately over each partition of the positions: partition k
//     is [k * P, (k + 1) * P) with P = kPartitionTokens rounded up to whole tiles,
//     fixed by absolute position, starting from m = -inf, l = 0, acc = 0. Each
//     gives (m_k, l_k, acc_k); they are merged in ascending k (MergePartition):
//     (M, L, A) = partition 0's, then M' = max(M, m_k), cA = Exp(M - M'),
//     cB = Exp(m_k - M') (1 where the max did not move), L = fma(L, cA, l_k * cB),
//     A[c] = fma(A[c], cA, acc_k[c] * cB);
//  5. out = A * (1 / L). (One partition: A = acc, L = l, as without partitions.)
// Which other query vectors share the item, its row in the batch, the thread
// count and whether a partition ran in this item or in another (split-K, below)
// change only which of them are computed together, never these operations, so a
// token's output is bitwise the same alone, in any batch and however its prompt
// was chunked. (Results differ between the AVX-512 and AVX2 builds.)
//
// Split-K. A decode row's item covers all partitions of its context ("whole"),
// unless the batch has too few items to keep every thread busy (one long
// sequence, or a few, with three KV heads: three items for two threads): then
// each decode item is cut into pieces of whole partitions, each piece writes its
// partitions' (m_k, l_k, acc_k) to a shared buffer, and after a barrier one merge
// per (row, head group) runs step 4 over them in ascending k. Prefill rows are
// never split (they give enough items).
//
// Scores want K dimension-major ([D, keys], so that one vector holds kLanes
// keys' partial dots, with no horizontal sums), which is how the cache stores a
// block's K (kv/kv_layout.h): when B is a multiple of kLanes the score kernel
// reads each chunk of kLanes keys straight from its block (row stride B);
// otherwise the tile's keys are first gathered into scratch [D, tile]. Both
// give the same operations, hence the same bits. P.V keeps the accumulators of
// up to kPvRows query vectors in registers (V is token-major). With a bf16 cache
// (and D a multiple of 2 * kLanes) P.V widens V in pairs: one load of 2 * kLanes
// values gives the even dimensions (shifted) and the odd ones (masked), two ops
// where widening each half costs four, so the accumulators hold each group of
// 2 * kLanes dimensions as evens then odds ("paired" order) until the output is
// written; every dimension's FMA chain is the same, hence the same bits. Scratch is
// thread-local and grow-only: no heap allocation per call once warm.
#include <omp.h>

#include <cstdint>
#include <cstdlib>

#include "backend/cpu/kernels_isa.h"
#include "core/dtype.h"

namespace kvmesh::backend::cpu::KVMESH_CPU_ISA {
namespace {

constexpr int64_t kMinTileTokens = 32;  // a tile is the fewest whole blocks holding >= this many keys
constexpr int64_t kPartitionTokens = 512;  // softmax partition (step 4), rounded up to whole tiles
constexpr int64_t kItemsPerThread = 8;     // split-K until the batch has this many items per thread
constexpr int kMaxQueryVectors = 32;    // (row, head) pairs per work item
// How far ahead K/V tiles are prefetched (DRAM-resident KV), into L2: the score and P.V
// loops read from L2 faster than DRAM delivers. Into L1 instead, decode over KV far
// larger than the cache ran 15-30% slower (paged_attention_bench, DRAM cases: 15-19
// GB/s against 19-22). The lines are issued from inside those loops (SpreadPrefetcher).
constexpr int64_t kPrefetchTiles = 2;
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

// Prefetches a list of byte ranges into L2 a few lines at a time, from inside the
// loops that consume the current tile, at the pace they consume it. Issued all at
// once, a tile's 100-400 prefetches fill the core's miss buffers and the computation
// waits behind them, so memory and arithmetic times add up: SmolLM2's decode attention
// at batch 16 with a 2k context read KV at 17.5 GB/s with each tile's prefetches
// issued at once and at 25 GB/s spread (engine_step_bench, two cores). Prefetches
// change no result. One per work item, used by the thread running it.
class SpreadPrefetcher {
 public:
  // One K and one V range per block of the tiles queued at once (an item's first
  // kPrefetchTiles; TileTokens: at most 32 blocks a tile). More flushes early.
  static constexpr int kMaxRanges = 2 * 32 * kPrefetchTiles;

  void Add(const void* begin, int64_t bytes) {
    if (bytes <= 0) return;
    if (count_ == kMaxRanges) Flush();
    const char* b = static_cast<const char*>(begin);
    ranges_[count_++] = Range{b, b + bytes};  // Issue and Flush move on to it when they get there
  }

  // Issues up to `lines` more prefetches.
  KVMESH_VEC_INLINE void Issue(int lines) {
    for (int i = 0; i < lines; ++i) {
      if (cur_ >= end_ && !NextRange()) return;
      PrefetchL2(cur_);
      cur_ += 64;
    }
  }

  // Issues everything not yet issued.
  void Flush() {
    while (cur_ < end_ || NextRange()) {
      for (; cur_ < end_; cur_ += 64) PrefetchL2(cur_);
    }
    count_ = next_ = 0;
  }

 private:
  struct Range {
    const char* begin;
    const char* end;
  };

  bool NextRange() {
    if (next_ == count_) {
      cur_ = end_ = nullptr;
      return false;
    }
    cur_ = ranges_[next_].begin;
    end_ = ranges_[next_].end;
    ++next_;
    return true;
  }

  Range ranges_[kMaxRanges];
  int count_ = 0;
  int next_ = 0;
  const char* cur_ = nullptr;
  const char* end_ = nullptr;
};

// Lines of a tile one iteration of a loop consumes (at least one): a spread
// prefetcher issued this many per iteration keeps pace with it.
template <typename T>
constexpr int LinesPerLoad(int vectors) {
  return Max(1, vectors * kLanes * static_cast<int>(sizeof(T)) / 64);
}

thread_local Scratch tls_item_scratch;  // per worker thread: one item's tiles and state
thread_local Scratch tls_plan_scratch;  // calling thread: the work item list
thread_local Scratch tls_split_scratch;  // calling thread: split-K partials and merge list

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
KVMESH_VEC_INLINE void GatherKeys(const T* const* keys, int64_t n, int64_t d, int64_t bs, float* kt, int64_t ldk,
                                  SpreadPrefetcher* pf) {
  for (int64_t c = 0; c < d; ++c) {
    pf->Issue(LinesPerLoad<T>(static_cast<int>(n / kLanes)));
    for (int64_t j = 0; j < n; ++j) kt[c * ldk + j] = KvToF32(keys[j][c * bs]);
  }
}

// ---- Scores: R query vectors x NC chunks of kLanes keys, one FMA chain over c each.
// Chunk i's keys are kchunks[i][c * ldk + lane] (dimension-major).
// scores[r][j * kLanes + lane] = dot * scale, or -inf where the key index >= visible[r].
template <int R, int NC, typename T>
KVMESH_VEC_INLINE void ScoreBlock(const float* const* q, const T* const* kchunks, int64_t ldk, int64_t d,
                                  int64_t chunk0, const int32_t* visible, float scale, float* scores,
                                  int64_t ld_scores, SpreadPrefetcher* pf) {
  V acc[R][NC];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NC; ++j) acc[r][j] = Zero();
  }
  const T* k[NC];
  for (int j = 0; j < NC; ++j) k[j] = kchunks[chunk0 + j];
  for (int64_t c = 0; c < d; ++c) {
    pf->Issue(LinesPerLoad<T>(NC));
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
            const int32_t* visible, float scale, float* scores, int64_t ld_scores, SpreadPrefetcher* pf) {
  int64_t chunk = 0;
  for (; chunk + 2 <= num_chunks; chunk += 2) {
    ScoreBlock<R, 2, T>(q, kt, ldk, d, chunk, visible, scale, scores, ld_scores, pf);
  }
  if (chunk < num_chunks) ScoreBlock<R, 1, T>(q, kt, ldk, d, chunk, visible, scale, scores, ld_scores, pf);
}

template <typename T>
void ScoresAny(int r, const float* const* q, const T* const* kt, int64_t ldk, int64_t d, int64_t num_chunks,
               const int32_t* visible, float scale, float* scores, int64_t ld_scores, SpreadPrefetcher* pf) {
  static_assert(kQkRows == 4);
  switch (r) {
    case 1: return Scores<1, T>(q, kt, ldk, d, num_chunks, visible, scale, scores, ld_scores, pf);
    case 2: return Scores<2, T>(q, kt, ldk, d, num_chunks, visible, scale, scores, ld_scores, pf);
    case 3: return Scores<3, T>(q, kt, ldk, d, num_chunks, visible, scale, scores, ld_scores, pf);
    default: return Scores<4, T>(q, kt, ldk, d, num_chunks, visible, scale, scores, ld_scores, pf);
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
  SpreadPrefetcher* pf;
};

// Paired (bf16 only): the accumulators and V are in paired order (see the top).
template <int R, int NV, typename T, bool Paired>
KVMESH_VEC_INLINE void PvBlock(const PvArgs<T>& a) {
  V acc[R][NV];
  for (int r = 0; r < R; ++r) {
    const V corr = Set1(a.correction[r]);
    for (int v = 0; v < NV; ++v) acc[r][v] = Mul(Load(a.acc[r] + a.c0 + v * kLanes), corr);
  }
  for (int64_t s = 0; s < a.num_keys; ++s) {
    a.pf->Issue(LinesPerLoad<T>(NV));
    const T* vrow = a.vrows[s] + a.c0;
    V x[NV];
    if constexpr (Paired) {
      static_assert(NV % 2 == 0 && sizeof(T) == 2);
      for (int v = 0; v < NV; v += 2) {
        const VI w = LoadIu(vrow + v * kLanes);
        x[v] = Bf16Low(w);
        x[v + 1] = Bf16High(w);
      }
    } else {
      for (int v = 0; v < NV; ++v) x[v] = LoadKv(vrow + v * kLanes);
    }
    for (int r = 0; r < R; ++r) {
      const V p = Set1(a.probs[r][s]);
      for (int v = 0; v < NV; ++v) acc[r][v] = Fma(p, x[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < NV; ++v) Store(a.acc[r] + a.c0 + v * kLanes, acc[r][v]);
  }
}

// Paired: NV steps by 2 (whole pairs).
template <int R, int NV, typename T, bool Paired>
void PvVecs(int nv, const PvArgs<T>& a) {
  constexpr int kStep = Paired ? 2 : 1;
  if constexpr (NV > kStep) {
    if (nv < NV) return PvVecs<R, NV - kStep, T, Paired>(nv, a);
  }
  PvBlock<R, NV, T, Paired>(a);
}

template <int R, typename T, bool Paired>
void PvAny(int r, int nv, const PvArgs<T>& a) {
  if constexpr (R > 1) {
    if (r < R) return PvAny<R - 1, T, Paired>(r, nv, a);
  }
  PvVecs<R, kPvVecs, T, Paired>(nv, a);
}

// Whether a cache of T and head_dim d runs P.V paired (see the top).
template <typename T>
KVMESH_VEC_INLINE bool PairedV(int64_t d) {
  static_assert(kPvVecs % 2 == 0);
  return sizeof(T) == 2 && d % (2 * kLanes) == 0;
}

// Runs P.V over all of head_dim for r (<= kPvRows) query vectors.
template <typename T>
void Pv(int r, float* const* acc, const float* correction, const float* const* probs, const T* const* vrows,
        int64_t num_keys, int64_t d, SpreadPrefetcher* pf) {
  const bool paired = PairedV<T>(d);
  for (int64_t c0 = 0; c0 < d; c0 += kPvVecs * kLanes) {
    const int nv = static_cast<int>(Min<int64_t>(kPvVecs, (d - c0) / kLanes));
    const PvArgs<T> args{acc, correction, probs, vrows, num_keys, c0, pf};
    if constexpr (sizeof(T) == 2) {
      if (paired) {
        PvAny<kPvRows, T, true>(r, nv, args);
        continue;
      }
    }
    PvAny<kPvRows, T, false>(r, nv, args);
  }
}

// out[0..d) = a * inv, from accumulators in paired order where `paired`.
KVMESH_VEC_INLINE void WriteOutput(float* out, const float* a, float inv_sum, int64_t d, bool paired) {
  const V inv = Set1(inv_sum);
  if (paired) {
    for (int64_t c = 0; c < d; c += 2 * kLanes) {
      StoreInterleaved(out + c, Mul(Load(a + c), inv), Mul(Load(a + c + kLanes), inv));
    }
    return;
  }
  for (int64_t c = 0; c < d; c += kLanes) Store(out + c, Mul(Load(a + c), inv));
}

// ---- Work items.

struct WorkItem {
  int64_t cost;  // ~ query vectors x keys attended
  int32_t seq;
  int32_t row0;   // first query row, relative to the sequence's chunk
  int32_t rows;
  int32_t head0;  // first query head
  int32_t heads;  // query heads (all of one KV head's group, or a slice of it)
  // Split-K pieces only (rows == 1): partitions [part_begin, part_end) of the row's
  // context, whose raw (m, l, acc) go to slots split_slot + k of the split-K buffer.
  // split_slot < 0: a whole item (every partition, merged and written here).
  int32_t part_begin = 0;
  int32_t part_end = 0;
  int64_t split_slot = -1;
};

// The split-K buffer: slot (a partition of one decode row's head group) x query
// head of the group (SlotHeads, the most an item has) x (acc[d], m, l).
KVMESH_VEC_INLINE int64_t PartialFloats(int64_t d) { return d + 2; }
// Query heads of a decode row's item: all of the row's heads when they fit one item
// (its KV heads are then read block by block together, see DecodeItemHeads), else one
// KV head's group or a slice of it.
KVMESH_VEC_INLINE int64_t DecodeItemHeads(const PagedAttentionParams& p) {
  return p.h <= kMaxQueryVectors ? p.h : Min<int64_t>(p.h / p.hkv, kMaxQueryVectors);
}
KVMESH_VEC_INLINE int64_t SlotHeads(const PagedAttentionParams& p) { return DecodeItemHeads(p); }

// Step 4: merges partition state (m, l, acc) into the running (M, L, A).
KVMESH_VEC_INLINE void MergePartition(float* big_m, float* big_l, float* big_a, float m, float l, const float* acc,
                                      int64_t d) {
  const float mn = Max(*big_m, m);
  const float ca = *big_m == mn ? 1.0f : FirstLane(Exp(Set1(*big_m - mn)));
  const float cb = m == mn ? 1.0f : FirstLane(Exp(Set1(m - mn)));
  *big_l = __builtin_fmaf(*big_l, ca, l * cb);
  const V cav = Set1(ca), cbv = Set1(cb);
  for (int64_t c = 0; c < d; c += kLanes) Store(big_a + c, Fma(Load(big_a + c), cav, Mul(Load(acc + c), cbv)));
  *big_m = mn;
}

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

int64_t PartitionTokens(int64_t block_size) {
  const int64_t tile = TileTokens(block_size);
  return tile * CeilDiv(kPartitionTokens, tile);
}

// T: the cache's element type (float, or uint16_t for bf16).
template <typename T>
void ProcessItem(const PagedAttentionParams& p, const WorkItem& item, float* partials) {
  const int64_t d = p.d;
  const int64_t bs = p.block_size;
  const int64_t group = p.h / p.hkv;
  const int64_t kvh0 = item.head0 / group;
  // A decode item may hold several whole KV-head groups (rows == 1, heads = kv_span *
  // group): per tile each KV head's keys are scored against its own group's query
  // vectors, which are contiguous (i = head - head0). Otherwise one KV head's.
  const int64_t kv_span = item.rows == 1 && item.heads > group ? item.heads / group : 1;
  const int64_t tile = TileTokens(bs);
  const int64_t ld = CeilDiv(tile, kLanes) * kLanes;  // padded tile width
  const int64_t q_row0 = p.query_start[item.seq];
  const int64_t n = p.query_start[item.seq + 1] - q_row0;
  const int64_t first_pos = static_cast<int64_t>(p.context_lens[item.seq]) - n + item.row0;  // of the item's row 0
  const int64_t last_pos = first_pos + item.rows - 1;
  const int nq = item.rows * item.heads;
  const int64_t part = PartitionTokens(bs);
  const bool split = item.split_slot >= 0;
  const int64_t t_begin = split ? item.part_begin * part : 0;
  const int64_t t_end = split ? Min<int64_t>(item.part_end * part, last_pos + 1) : last_pos + 1;  // keys [t_begin, t_end)

  // K chunks come straight from the cache when every chunk of kLanes keys lies in
  // one block; otherwise they are gathered into kt.
  const bool direct_k = bs % kLanes == 0;
  // Scratch: kt [d, ld] | scores [kMaxQueryVectors, ld] | acc, merged A [kMaxQueryVectors, d] each | key,
  // V row, cache K chunk and kt chunk pointers (ld each, so the two chunk lists never share storage).
  float* kt = static_cast<float*>(
      tls_item_scratch.Get((d * ld + kMaxQueryVectors * ld + 2 * kMaxQueryVectors * d) * 4 + 4 * ld * 8));
  float* scores = kt + d * ld;
  float* acc_base = scores + kMaxQueryVectors * ld;
  float* merged_base = acc_base + kMaxQueryVectors * d;
  const T** kptr = reinterpret_cast<const T**>(merged_base + kMaxQueryVectors * d);
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
  float merged_max[kMaxQueryVectors];  // step 4's running M, L (A: merged_base)
  float merged_sum[kMaxQueryVectors];
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
  const int64_t block_stride = 2 * p.hkv * head_stride;

  // Ends the partition starting at part_start for the query vectors that saw any of
  // it (a suffix: they are ordered by position): its (m, l, acc) is merged into the
  // running state (whole item) or stored for the split-K merge; then reset.
  auto end_partition = [&](int64_t part_start) {
    const int from = static_cast<int>(Max<int64_t>(0, part_start - first_pos) * item.heads);
    for (int i = from; i < nq; ++i) {
      if (split) {
        float* dst = partials + ((item.split_slot + part_start / part) * SlotHeads(p) + i) * PartialFloats(d);
        for (int64_t c = 0; c < d; c += kLanes) Store(dst + c, Load(accv[i] + c));
        dst[d] = row_max[i];
        dst[d + 1] = row_sum[i];
      } else if (part_start == 0) {
        float* a = merged_base + i * d;
        for (int64_t c = 0; c < d; c += kLanes) Store(a + c, Load(accv[i] + c));
        merged_max[i] = row_max[i];
        merged_sum[i] = row_sum[i];
      } else {
        MergePartition(merged_max + i, merged_sum + i, merged_base + i * d, row_max[i], row_sum[i], accv[i], d);
      }
      row_max[i] = -__builtin_inff();
      row_sum[i] = 0.0f;
      for (int64_t c = 0; c < d; c += kLanes) Store(accv[i] + c, Zero());
    }
  };

  // Queues the tile at key t for prefetching, if the item reaches it: each block's K
  // heads of the item, then its V heads (with every KV head, the whole block: one
  // contiguous run, which DRAM serves far faster than 2 KB pieces).
  SpreadPrefetcher prefetcher;
  auto queue_tile_prefetches = [&](int64_t t) {
    if (t >= t_end) return;
    const int64_t keys = Min(tile, t_end - t);
    const int32_t* blocks = table + t / bs;
    for (int64_t s0 = 0; s0 < keys; s0 += bs) {
      const int64_t off = static_cast<int64_t>(blocks[s0 / bs]) * block_stride;
      // K of a block head is [D][B] (read whole); V rows are contiguous.
      const int64_t k_bytes = kv_span * bs * d * static_cast<int64_t>(sizeof(T));
      const int64_t v_bytes = ((kv_span - 1) * bs + Min(bs, keys - s0)) * d * static_cast<int64_t>(sizeof(T));
      prefetcher.Add(cache + off + kvh0 * head_stride, k_bytes);
      prefetcher.Add(cache + off + (p.hkv + kvh0) * head_stride, v_bytes);
    }
  };
  // The item's first tile is read as soon as it starts; the ones up to the prefetch
  // distance are spread over it (a split-K piece or a short context is only a few
  // tiles long, so they are worth not missing).
  for (int64_t k = 1; k <= kPrefetchTiles; ++k) queue_tile_prefetches(t_begin + k * tile);
  for (int64_t t0 = t_begin; t0 < t_end; t0 += tile) {
    if (t0 > t_begin && t0 % part == 0) end_partition(t0 - part);
    const int64_t num_keys = Min(tile, t_end - t0);
    const int64_t num_chunks = CeilDiv(num_keys, kLanes);
    const int32_t* tile_blocks = table + t0 / bs;  // a tile is whole blocks (t0 % bs == 0)
    // Prefetch K and V kPrefetchTiles tiles ahead while this one is computed. The
    // loops below issue them as they go; what they leave is issued here. The tiles
    // the first one spreads were queued above the loop.
    if (t0 > t_begin) {
      prefetcher.Flush();
      queue_tile_prefetches(t0 + kPrefetchTiles * tile);
    }
    // Query vectors are ordered by row, so those that see this tile are a suffix
    // (with kv_span > 1, one row: all of them).
    const int first = static_cast<int>(Max<int64_t>(0, t0 - first_pos) * item.heads);
    for (int i = first; i < nq; ++i) visible[i] = static_cast<int32_t>(Min(num_keys, pos[i] - t0 + 1));
    for (int64_t g = 0; g < kv_span; ++g) {
      const T* k_base = cache + (kvh0 + g) * head_stride;
      const T* v_base = cache + (p.hkv + kvh0 + g) * head_stride;
      // This KV head's query vectors [i_begin, i_end).
      const int i_begin = kv_span > 1 ? static_cast<int>(g * group) : first;
      const int i_end = kv_span > 1 ? static_cast<int>((g + 1) * group) : nq;
      // Key pointers (K: the key's column of its block's [D][B] K; V: its row);
      // padding past num_keys repeats the last key (finite, masked). Keys are walked
      // block by block without a division per key.
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
      if (!direct_k) GatherKeys(kptr, num_chunks * kLanes, d, bs, kt, ld, &prefetcher);
      for (int i = i_begin; i < i_end; i += kQkRows) {
        const int r = Min(kQkRows, i_end - i);
        if (direct_k) {
          ScoresAny<T>(r, qv + i, kchunk, bs, d, num_chunks, visible + i, p.scale, scores + i * ld, ld, &prefetcher);
        } else {
          ScoresAny<float>(r, qv + i, kt_chunk, ld, d, num_chunks, visible + i, p.scale, scores + i * ld, ld, &prefetcher);
        }
      }
      // Online softmax: the tile's max, probabilities in place, running sum.
      for (int i = i_begin; i < i_end; ++i) {
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
      for (int i = i_begin; i < i_end; i += kPvRows) {
        const int r = Min(kPvRows, i_end - i);
        int64_t common = visible[i];
        for (int j = 1; j < r; ++j) common = Min<int64_t>(common, visible[i + j]);
        Pv<T>(r, accv + i, correction + i, probs + i, vptr, common, d, &prefetcher);
        for (int j = 0; j < r; ++j) {
          if (visible[i + j] > common) {
            const float* rest = probs[i + j] + common;
            Pv<T>(1, accv + i + j, kOne, &rest, vptr + common, visible[i + j] - common, d, &prefetcher);
          }
        }
      }
    }
  }

  end_partition((t_end - 1) / part * part);
  if (split) return;  // the merge pass writes out
  for (int i = 0; i < nq; ++i) {
    const int64_t r = i / item.heads;
    const int64_t hh = item.head0 + i % item.heads;
    float* o = p.out + ((q_row0 + item.row0 + r) * p.h + hh) * d;
    WriteOutput(o, merged_base + i * d, 1.0f / merged_sum[i], d, PairedV<T>(d));
  }
}

// The split-K merge of one decode row's head group: steps 4-5 over the partials of
// partitions 0..num_parts-1 in ascending order, as a whole item does them.
struct SplitGroup {
  int64_t slot;      // first partition's slot in the partials buffer
  int32_t num_parts;
  int32_t out_row;   // query row in the batch
  int32_t head0;
  int32_t heads;
};

// Partition 0's slot becomes the running A.
void MergeSplitGroup(const PagedAttentionParams& p, const SplitGroup& g, float* partials) {
  const int64_t d = p.d;
  const int64_t pf = PartialFloats(d);
  for (int32_t hh = 0; hh < g.heads; ++hh) {
    float* a = partials + (g.slot * SlotHeads(p) + hh) * pf;
    float big_m = a[d], big_l = a[d + 1];
    for (int32_t k = 1; k < g.num_parts; ++k) {
      const float* pk = partials + ((g.slot + k) * SlotHeads(p) + hh) * pf;
      MergePartition(&big_m, &big_l, a, pk[d], pk[d + 1], pk, d);
    }
    float* o = p.out + (static_cast<int64_t>(g.out_row) * p.h + g.head0 + hh) * d;
    const bool paired = p.kv_bf16 ? PairedV<uint16_t>(d) : PairedV<float>(d);
    WriteOutput(o, a, 1.0f / big_l, d, paired);
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
  const int64_t part = PartitionTokens(p.block_size);
  int64_t whole_items = 0;
  int64_t decode_parts = 0;  // partitions of all decode rows' contexts (x head chunks), if every one were split
  // A decode row's item takes all of its query heads when they fit (DecodeItemHeads):
  // each tile then reads every KV head of a block, the block's whole K and V run.
  // Except where that leaves threads idle: when the fused batch has fewer items than
  // threads and no decode row spans two partitions (split-K cannot cut it), a lone
  // short decode row would run on one thread; one item per KV head shares it out.
  int64_t prefill_items = 0, decode_rows = 0, decode_row_parts = 0;
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const int64_t n = p.query_start[s + 1] - p.query_start[s];
    if (n == 1) {
      ++decode_rows;
      decode_row_parts += CeilDiv(p.context_lens[s], part);
    } else {
      prefill_items += CeilDiv(n, rows_per_item) * p.hkv * head_chunks;
    }
  }
  const bool long_decode = decode_row_parts > decode_rows;  // some decode row spans two partitions
  const bool fuse_decode_heads =
      p.h <= kMaxQueryVectors && (prefill_items + decode_rows >= num_threads || long_decode);
  const int64_t decode_items_per_row = fuse_decode_heads ? 1 : p.hkv * head_chunks;
  whole_items = prefill_items + decode_rows * decode_items_per_row;
  decode_parts = decode_row_parts * decode_items_per_row;
  if (whole_items == 0) return;
  // Split-K (see the top): pieces of parts_per_piece partitions, so that the batch
  // has about kItemsPerThread items per thread. Only the count of items depends on
  // the thread count, never a result.
  const int64_t target_items = kItemsPerThread * Max(1, num_threads);
  const bool split = num_threads > 1 && whole_items < target_items && decode_parts > whole_items;
  const int64_t parts_per_piece = split ? Max<int64_t>(1, CeilDiv(decode_parts, target_items)) : 0;
  int64_t max_items = whole_items;
  if (split) max_items += decode_parts;  // an upper bound on the pieces
  int64_t num_slots = split ? decode_parts : 0;
  WorkItem* items = static_cast<WorkItem*>(tls_plan_scratch.Get(max_items * static_cast<int64_t>(sizeof(WorkItem))));
  SplitGroup* groups = nullptr;
  float* partials = nullptr;
  if (split) {
    // SplitGroups first (64-byte multiple), then the partials.
    const int64_t group_bytes = CeilDiv(decode_parts * static_cast<int64_t>(sizeof(SplitGroup)), 64) * 64;
    char* base = static_cast<char*>(
        tls_split_scratch.Get(group_bytes + num_slots * SlotHeads(p) * PartialFloats(p.d) * 4));
    groups = reinterpret_cast<SplitGroup*>(base);
    partials = reinterpret_cast<float*>(base + group_bytes);
  }
  int64_t total_cost = 0;
  int64_t count = 0;
  int64_t num_groups = 0;
  int64_t next_slot = 0;
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const int64_t n = p.query_start[s + 1] - p.query_start[s];
    const int64_t first_pos = static_cast<int64_t>(p.context_lens[s]) - n;
    const int64_t seq_parts = CeilDiv(p.context_lens[s], part);
    const bool split_seq = split && n == 1 && seq_parts > 1;
    const bool fused = n == 1 && fuse_decode_heads;
    for (int64_t row0 = 0; row0 < n; row0 += rows_per_item) {
      const int64_t rows = Min(rows_per_item, n - row0);
      for (int64_t kvh = 0; kvh < (fused ? 1 : p.hkv); ++kvh) {
        for (int64_t hc = 0; hc < (fused ? 1 : head_chunks); ++hc) {
          const int64_t head0 = fused ? 0 : kvh * group + hc * heads_per_item;
          const int64_t heads = fused ? p.h : Min(heads_per_item, (kvh + 1) * group - head0);
          const WorkItem whole{0, static_cast<int32_t>(s), static_cast<int32_t>(row0), static_cast<int32_t>(rows),
                               static_cast<int32_t>(head0), static_cast<int32_t>(heads)};
          if (!split_seq) {
            // Keys of the item's last row (the tile loop's length) x query vectors, plus a fixed overhead.
            WorkItem item = whole;
            item.cost = (first_pos + row0 + rows) * (rows * heads + 4) + 64;
            items[count++] = item;
            total_cost += item.cost;
            continue;
          }
          groups[num_groups++] = SplitGroup{next_slot, static_cast<int32_t>(seq_parts),
                                            p.query_start[s], static_cast<int32_t>(head0), static_cast<int32_t>(heads)};
          for (int64_t k0 = 0; k0 < seq_parts; k0 += parts_per_piece) {
            WorkItem item = whole;
            item.part_begin = static_cast<int32_t>(k0);
            item.part_end = static_cast<int32_t>(Min(seq_parts, k0 + parts_per_piece));
            item.split_slot = next_slot;
            const int64_t keys = Min<int64_t>(item.part_end * part, first_pos + 1) - k0 * part;
            item.cost = keys * (heads + 4) + 64;
            items[count++] = item;
            total_cost += item.cost;
          }
          next_slot += seq_parts;
        }
      }
    }
  }
  SortByCostDescending(items, count);
  // A lone short decode stays on this thread.
  const int threads = total_cost * p.d < (1 << 17) ? 1 : static_cast<int>(Min<int64_t>(num_threads, count));
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < count; ++i) {
      if (p.kv_bf16) {
        ProcessItem<uint16_t>(p, items[i], partials);
      } else {
        ProcessItem<float>(p, items[i], partials);
      }
    }
    // The implied barrier above: every partial is written.
#pragma omp for schedule(static)
    for (int64_t g = 0; g < num_groups; ++g) MergeSplitGroup(p, groups[g], partials);
  }
}

}  // namespace kvmesh::backend::cpu::KVMESH_CPU_ISA
