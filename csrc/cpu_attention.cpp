// Paged attention on the CPU: the kernel of tritonlm/worker/attention/cpu_paged.py.
//
// Each query row (a new token of the step: a decoding sequence's, or one of a prefill chunk's)
// attends over the first `row_len` positions of its
// sequence, read in place from the paged pools `[slots, kv_heads, head_dim]` through its block
// table (slot = table[p / block_size] * block_size + p % block_size). A task is one row with all
// its key heads (or one key head, when rows are too few for the threads); the query heads of a
// key head's group share each key/value row as it is loaded (grouped-query attention). Scores,
// softmax and the weighted sum are in fp32 whatever the storage (fp32, bf16 or fp16); the softmax
// is online, 16 positions at a time (a block at a time in the plain loop).
//
// The pools hold the query's type, or int8 (`kv_cache_dtype` int8: `paged_attention_int8`) with an
// fp32 scale per (slot, key head) in scale pools `[slots, kv_heads]`: a stored row is its int8
// numbers times its scale. The scale is applied once per score (q.k * scale) and once per weight
// (w * scale), never per element.
//
// Two versions of the same loop: AVX-512F (function-level target, so this file builds with the
// compiler's default flags and runs anywhere; chosen at run time from cpuid) and plain C++.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu_vector.h"

namespace {

// One call's shapes and pointers (strides in elements).
struct Problem {
  const void* keys;
  const void* values;
  int64_t kv_heads, dim, block_size, group;
  const int32_t* tables;
  int64_t table_stride;
  const int32_t* row_seq;
  const int32_t* row_len;
  const void* query;
  int64_t q_row, q_head;
  void* out;
  int64_t o_row, o_head;
  float scale;
  const float* key_scales = nullptr;  // int8 pools only: [slots, kv_heads]
  const float* value_scales = nullptr;
};

// S, the pools' element type: the query's type T, or int8 with its scales.
template <typename S>
constexpr bool kQuantized = std::is_same_v<S, int8_t>;


// The state of one key head's group while a task runs: q [G][D], acc [G][D], scores [G][padded
// block], max and sum [G].
struct Scratch {
  std::vector<float> buffer;
  float *q, *acc, *scores, *max, *sum;
  int64_t padded;
  Scratch(const Problem& p) {
    padded = (p.block_size + 15) / 16 * 16;
    buffer.assign(p.group * (2 * p.dim + padded + 2), 0.f);
    q = buffer.data();
    acc = q + p.group * p.dim;
    scores = acc + p.group * p.dim;
    max = scores + p.group * padded;
    sum = max + p.group;
  }
};

template <typename T>
void start_task(const Problem& p, int64_t row, int64_t head, Scratch& s) {
  const T* q = static_cast<const T*>(p.query) + row * p.q_row;
  for (int64_t g = 0; g < p.group; ++g) {
    const T* qh = q + (head * p.group + g) * p.q_head;
    for (int64_t d = 0; d < p.dim; ++d) s.q[g * p.dim + d] = to_float(qh[d]);
    std::fill(s.acc + g * p.dim, s.acc + (g + 1) * p.dim, 0.f);
    s.max[g] = -std::numeric_limits<float>::infinity();
    s.sum[g] = 0.f;
  }
}

template <typename T>
void finish_task(const Problem& p, int64_t row, int64_t head, const Scratch& s) {
  T* o = static_cast<T*>(p.out) + row * p.o_row;
  for (int64_t g = 0; g < p.group; ++g) {
    T* oh = o + (head * p.group + g) * p.o_head;
    const float inv = s.sum[g] > 0.f ? 1.f / s.sum[g] : 0.f;
    for (int64_t d = 0; d < p.dim; ++d) oh[d] = static_cast<T>(s.acc[g * p.dim + d] * inv);
  }
}

// A task: query row `row`, key heads [first, last), states[h - first] the state of head h.
using Task = void (*)(const Problem&, int64_t row, int64_t first, int64_t last, Scratch* states);

// ---- plain C++ ------------------------------------------------------------------------------
template <typename T, typename S>
void task_plain(const Problem& p, int64_t row, int64_t head, Scratch& s) {
  start_task<T>(p, row, head, s);
  const int64_t len = p.row_len[row], stride = p.kv_heads * p.dim, D = p.dim;
  const int32_t* table = p.tables + p.row_seq[row] * p.table_stride;
  for (int64_t start = 0; start < len; start += p.block_size) {
    const int64_t n = std::min(p.block_size, len - start);
    const int64_t first = (int64_t)table[start / p.block_size] * p.block_size;  // the block's first slot
    const int64_t base = first * stride + head * D;
    const S* k = static_cast<const S*>(p.keys) + base;
    const S* v = static_cast<const S*>(p.values) + base;
    for (int64_t g = 0; g < p.group; ++g) {
      float* sc = s.scores + g * s.padded;
      const float* qg = s.q + g * D;
      float top = s.max[g];
      for (int64_t i = 0; i < n; ++i) {
        float dot = 0.f;
        for (int64_t d = 0; d < D; ++d) dot += qg[d] * to_float(k[i * stride + d]);
        if constexpr (kQuantized<S>) dot *= p.key_scales[(first + i) * p.kv_heads + head];
        sc[i] = dot * p.scale;
        top = std::max(top, sc[i]);
      }
      const float correction = std::exp(s.max[g] - top);
      float total = s.sum[g] * correction;
      float* acc = s.acc + g * D;
      for (int64_t d = 0; d < D; ++d) acc[d] *= correction;
      for (int64_t i = 0; i < n; ++i) {
        const float w = std::exp(sc[i] - top);
        total += w;
        float rounded = to_float(static_cast<T>(w));  // see round_like
        if constexpr (kQuantized<S>) rounded *= p.value_scales[(first + i) * p.kv_heads + head];
        for (int64_t d = 0; d < D; ++d) acc[d] += rounded * to_float(v[i * stride + d]);
      }
      s.max[g] = top;
      s.sum[g] = total;
    }
  }
  finish_task<T>(p, row, head, s);
}

template <typename T, typename S>
void heads_plain(const Problem& p, int64_t row, int64_t first, int64_t last, Scratch* states) {
  for (int64_t head = first; head < last; ++head) task_plain<T, S>(p, row, head, states[head - first]);
}

// ---- AVX-512F -------------------------------------------------------------------------------
// Positions go 16 at a time (a "chunk", whatever the block size): 16 scores per query head in one
// register, one online-softmax update per chunk. G (query heads per key head) and C (head_dim / 16)
// are compile-time, so the accumulators stay in registers.
#ifdef TRITONLM_X86

// Lane i of the result = the sum of the lanes of v[i]: a transpose-and-add tree (45 instructions
// for 16 sums, against ~8 each one by one).
AVX512 inline __m512 sum16(__m512* v) {
  __m512 w[8], x[4], y[2];
  for (int j = 0; j < 8; ++j)
    w[j] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * j], v[2 * j + 1]), _mm512_unpackhi_ps(v[2 * j], v[2 * j + 1]));
  for (int j = 0; j < 4; ++j)
    x[j] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * j], w[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(w[2 * j], w[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int j = 0; j < 2; ++j)
    y[j] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * j], x[2 * j + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(x[2 * j], x[2 * j + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// A head's row as C fp32 registers. In bf16, each 32 elements give two: the even elements, then the
// odd ones (a shift and a mask, no shuffle); a dot product does not mind the order, and the weighted
// sum of values, accumulated in that order, is put back in order at the end (`in_order`). A query
// is loaded in its pools' order (`Split`: theirs), which differs from its own over int8 pools.
template <typename T, int C, bool Split = std::is_same_v<T, c10::BFloat16>>
AVX512 inline void load_row(const T* x, __m512* out) {
  if constexpr (Split) {
    static_assert(C % 2 == 0, "bf16 rows go 32 elements at a time");
    for (int j = 0; j < C / 2; ++j) {
      const __m512i raw = _mm512_loadu_si512(x + 32 * j);
      out[2 * j] = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
      out[2 * j + 1] = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
    }
  } else {
    for (int c = 0; c < C; ++c) out[c] = load16(x + 16 * c);
  }
}

// The accumulators of `load_row`'s order back in the head's order.
template <typename T>
void in_order(float* acc, int64_t dim) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    float split[32];
    for (int64_t j = 0; j < dim; j += 32) {
      std::copy(acc + j, acc + j + 32, split);
      for (int i = 0; i < 16; ++i) {
        acc[j + 2 * i] = split[i];
        acc[j + 2 * i + 1] = split[16 + i];
      }
    }
  }
}

// One chunk of n <= 16 positions (rows[i]: position i's key and value row of this head; over int8
// pools, key_scale[i] and value_scale[i] their scales).
template <typename T, typename S, int G, int C>
AVX512 inline void chunk_avx512(const Problem& p, const __m512 (*q)[C], const S* const* keys, const S* const* values,
                                int64_t offset, int n, Scratch& s, const float* key_scale, const float* value_scale) {
  const __mmask16 valid = n == 16 ? 0xFFFF : (__mmask16)((1u << n) - 1);
  alignas(64) float weights[G][16];
  // Each key row is loaded (and widened) once for the whole group.
  __m512 dots[G][16];
  for (int i = 0; i < 16; ++i) {
    __m512 dot[G];
    for (int g = 0; g < G; ++g) dot[g] = _mm512_setzero_ps();
    if (i < n) {
      __m512 k[C];
      load_row<S, C>(keys[i] + offset, k);
      for (int c = 0; c < C; ++c)
        for (int g = 0; g < G; ++g) dot[g] = _mm512_fmadd_ps(q[g][c], k[c], dot[g]);
    }
    for (int g = 0; g < G; ++g) dots[g][i] = dot[g];
  }
  for (int g = 0; g < G; ++g) {
    __m512 scores = _mm512_mul_ps(sum16(dots[g]), _mm512_set1_ps(p.scale));
    if constexpr (kQuantized<S>) scores = _mm512_mul_ps(scores, _mm512_load_ps(key_scale));
    const float old = s.max[g];
    const float best = std::max(old, _mm512_mask_reduce_max_ps(valid, scores));
    const __m512 w = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(scores, _mm512_set1_ps(best))));
    _mm512_store_ps(weights[g], round_like<T>(w));
    float correction = 1.f;
    if (best > old) correction = _mm512_cvtss_f32(exp16(_mm512_set1_ps(old - best)));
    s.sum[g] = s.sum[g] * correction + _mm512_reduce_add_ps(w);
    s.max[g] = best;
    if (correction != 1.f) {
      const __m512 factor = _mm512_set1_ps(correction);
      for (int c = 0; c < C; ++c)
        _mm512_storeu_ps(s.acc + g * p.dim + 16 * c, _mm512_mul_ps(load16(s.acc + g * p.dim + 16 * c), factor));
    }
  }
  __m512 acc[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) acc[g][c] = load16(s.acc + g * p.dim + 16 * c);
  for (int i = 0; i < n; ++i) {
    __m512 weight[G];
    for (int g = 0; g < G; ++g)
      weight[g] = _mm512_set1_ps(kQuantized<S> ? weights[g][i] * value_scale[i] : weights[g][i]);
    __m512 v[C];
    load_row<S, C>(values[i] + offset, v);
    for (int c = 0; c < C; ++c)
      for (int g = 0; g < G; ++g) acc[g][c] = _mm512_fmadd_ps(weight[g], v[c], acc[g][c]);
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(s.acc + g * p.dim + 16 * c, acc[g][c]);
}

// Heads [first, last) of one query row. All heads of a row in one task (when there are rows enough
// for the threads) read each position's keys and values as one contiguous row of the pool, which
// the hardware prefetchers stream; one head per task would walk the same memory kv_heads times.
template <typename T, typename S, int G, int C>
AVX512 void task_avx512(const Problem& p, int64_t row, int64_t first, int64_t last, Scratch* states) {
  const int64_t len = p.row_len[row], stride = p.kv_heads * p.dim;
  const int32_t* table = p.tables + p.row_seq[row] * p.table_stride;
  const T* query = static_cast<const T*>(p.query) + row * p.q_row;
  for (int64_t head = first; head < last; ++head) {
    Scratch& s = states[head - first];
    start_task<T>(p, row, head, s);
    for (int g = 0; g < G; ++g) {  // the query heads in the order load_row gives the pools' rows
      __m512 q[C];
      load_row<T, C, std::is_same_v<S, c10::BFloat16>>(query + (head * G + g) * p.q_head, q);
      for (int c = 0; c < C; ++c) _mm512_storeu_ps(s.q + g * p.dim + 16 * c, q[c]);
    }
  }
  // Scattered blocks defeat the hardware prefetchers (they stop at page boundaries): the rows of
  // chunk j + 1 are prefetched into L2 while chunk j is computed (measured against L1, which the
  // current chunk needs, and 2 or 4 chunks ahead: 1.3-1.7x faster than those, 2x than none).
  constexpr int64_t kAhead = 1;
  const S* key_rows[16];
  const S* value_rows[16];
  int64_t row_slots[16];
  const int64_t from = first * p.dim * sizeof(S), to = last * p.dim * sizeof(S);  // bytes of a row
  auto locate = [&](int64_t start, bool prefetch) {
    const int n = static_cast<int>(std::min<int64_t>(16, len - start));
    for (int i = 0; i < n; ++i) {
      const int64_t pos = start + i;
      const int64_t slot = (int64_t)table[pos / p.block_size] * p.block_size + pos % p.block_size;
      const S* k = static_cast<const S*>(p.keys) + slot * stride;
      const S* v = static_cast<const S*>(p.values) + slot * stride;
      if (!prefetch) {
        key_rows[i] = k;
        value_rows[i] = v;
        row_slots[i] = slot;
        continue;
      }
      for (int64_t byte = from; byte < to; byte += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(k) + byte, _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(v) + byte, _MM_HINT_T1);
      }
    }
    return n;
  };
  for (int64_t j = 0; j < kAhead && 16 * j < len; ++j) locate(16 * j, true);
  for (int64_t start = 0; start < len; start += 16) {
    if (start + 16 * kAhead < len) locate(start + 16 * kAhead, true);
    const int n = locate(start, false);
    alignas(64) float key_scale[16], value_scale[16];  // int8 pools: the chunk's scales of a head
    for (int64_t head = first; head < last; ++head) {
      Scratch& s = states[head - first];
      __m512 q[G][C];
      for (int g = 0; g < G; ++g)
        for (int c = 0; c < C; ++c) q[g][c] = _mm512_loadu_ps(s.q + g * p.dim + 16 * c);
      if constexpr (kQuantized<S>) {
        for (int i = 0; i < 16; ++i) {
          key_scale[i] = i < n ? p.key_scales[row_slots[i] * p.kv_heads + head] : 0.f;
          value_scale[i] = i < n ? p.value_scales[row_slots[i] * p.kv_heads + head] : 0.f;
        }
      }
      chunk_avx512<T, S, G, C>(p, q, key_rows, value_rows, head * p.dim, n, s, key_scale, value_scale);
    }
  }
  for (int64_t head = first; head < last; ++head) {
    for (int g = 0; g < G; ++g) in_order<S>(states[head - first].acc + g * p.dim, p.dim);
    finish_task<T>(p, row, head, states[head - first]);
  }
}

template <typename T, typename S, int G>
Task pick_chunks(int64_t chunks) {
  switch (chunks) {
    case 2: return task_avx512<T, S, G, 2>;
    case 4: return task_avx512<T, S, G, 4>;
    case 6: return task_avx512<T, S, G, 6>;
    case 8: return task_avx512<T, S, G, 8>;
    default: return nullptr;
  }
}

// The AVX-512 task for these shapes, or nullptr (the plain loop runs them).
template <typename T, typename S>
Task avx512_task(int64_t dim, int64_t group) {
  if (dim % 16) return nullptr;
  switch (group) {
    case 1: return pick_chunks<T, S, 1>(dim / 16);
    case 2: return pick_chunks<T, S, 2>(dim / 16);
    case 3: return pick_chunks<T, S, 3>(dim / 16);
    case 4: return pick_chunks<T, S, 4>(dim / 16);
    case 5: return pick_chunks<T, S, 5>(dim / 16);
    case 6: return pick_chunks<T, S, 6>(dim / 16);
    case 7: return pick_chunks<T, S, 7>(dim / 16);
    case 8: return pick_chunks<T, S, 8>(dim / 16);
    default: return nullptr;
  }
}
#endif

template <typename T, typename S = T>
void run(const Problem& p, int64_t rows, bool vectorised) {
  Task task = heads_plain<T, S>;
#ifdef TRITONLM_X86
  if (vectorised && cpu_has_avx512f())
    if (Task fast = avx512_task<T, S>(p.dim, p.group)) task = fast;
#endif
  // A task per row with all its heads (see task_avx512), or per (row, head) when rows are too few
  // to keep the threads busy.
  const int64_t span = rows >= 2 * at::get_num_threads() ? p.kv_heads : 1;
  const int64_t per_row = p.kv_heads / span;
  at::parallel_for(0, rows * per_row, 1, [&](int64_t begin, int64_t end) {
    std::vector<Scratch> states;
    states.reserve(span);
    for (int64_t h = 0; h < span; ++h) states.emplace_back(p);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t first = (t % per_row) * span;
      task(p, t / per_row, first, first + span, states.data());
    }
  });
}

// A call's problem, its shapes checked (not the pools' dtype: the two ops' own checks).
Problem problem(const at::Tensor& out, const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values,
                const at::Tensor& tables, const at::Tensor& row_seq, const at::Tensor& row_len, int64_t block_size,
                double scale) {
  TORCH_CHECK(query.dim() == 3 && out.dim() == 3 && keys.dim() == 3, "query/out [rows, heads, dim], pools [slots, kv_heads, dim]");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.sizes() == values.sizes(), "pools: contiguous, same shape");
  TORCH_CHECK(query.stride(2) == 1 && out.stride(2) == 1, "query/out: contiguous head_dim");
  TORCH_CHECK(out.scalar_type() == query.scalar_type(), "out: the query's dtype");
  TORCH_CHECK(tables.scalar_type() == at::kInt && row_seq.scalar_type() == at::kInt && row_len.scalar_type() == at::kInt, "int32 tables");
  TORCH_CHECK(tables.is_contiguous() && row_seq.is_contiguous() && row_len.is_contiguous(), "contiguous tables");
  const int64_t rows = query.size(0), heads = query.size(1), dim = query.size(2), kv_heads = keys.size(1);
  TORCH_CHECK(keys.size(2) == dim && heads % kv_heads == 0, "head_dim and heads must match the pools");
  TORCH_CHECK(row_seq.numel() == rows && row_len.numel() == rows, "one row_seq/row_len per query row");
  return Problem{keys.data_ptr(), values.data_ptr(), kv_heads, dim, block_size, heads / kv_heads,
                 tables.data_ptr<int32_t>(), tables.dim() == 2 ? tables.stride(0) : 0,
                 row_seq.data_ptr<int32_t>(), row_len.data_ptr<int32_t>(),
                 query.data_ptr(), query.stride(0), query.stride(1),
                 out.data_ptr(), out.stride(0), out.stride(1), static_cast<float>(scale)};
}

// out [rows, heads, dim] = attention of query [rows, heads, dim] (last dim contiguous) over the
// pools [slots, kv_heads, dim] (contiguous); row r reads sequence row_seq[r]'s first row_len[r]
// positions through tables[row_seq[r]]. `vectorised`: the AVX-512 loop where it can run.
void paged_attention(at::Tensor& out, const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values,
                     const at::Tensor& tables, const at::Tensor& row_seq, const at::Tensor& row_len,
                     int64_t block_size, double scale, bool vectorised) {
  const Problem p = problem(out, query, keys, values, tables, row_seq, row_len, block_size, scale);
  TORCH_CHECK(query.scalar_type() == keys.scalar_type(), "one dtype");
  const int64_t rows = query.size(0);
  if (keys.scalar_type() == at::kFloat) {
    run<float>(p, rows, vectorised);
  } else if (keys.scalar_type() == at::kBFloat16) {
    run<c10::BFloat16>(p, rows, vectorised);
  } else if (keys.scalar_type() == at::kHalf) {
    run<c10::Half>(p, rows, vectorised);
  } else {
    TORCH_CHECK(false, "paged_attention: float32, bfloat16 or float16 only");
  }
}

// paged_attention over int8 pools, each row's values times its scale in key_scales / value_scales
// [slots, kv_heads] (fp32); query and out float32, bfloat16 or float16.
void paged_attention_int8(at::Tensor& out, const at::Tensor& query, const at::Tensor& keys, const at::Tensor& key_scales,
                          const at::Tensor& values, const at::Tensor& value_scales, const at::Tensor& tables,
                          const at::Tensor& row_seq, const at::Tensor& row_len, int64_t block_size, double scale,
                          bool vectorised) {
  Problem p = problem(out, query, keys, values, tables, row_seq, row_len, block_size, scale);
  TORCH_CHECK(keys.scalar_type() == at::kChar && values.scalar_type() == at::kChar, "paged_attention_int8: int8 pools");
  for (const at::Tensor* scales : {&key_scales, &value_scales}) {
    TORCH_CHECK(scales->scalar_type() == at::kFloat && scales->is_contiguous(), "scales: float32, contiguous");
    TORCH_CHECK(scales->dim() == 2 && scales->size(0) == keys.size(0) && scales->size(1) == keys.size(1),
                "scales: [slots, kv_heads] of the pools");
  }
  p.key_scales = key_scales.data_ptr<float>();
  p.value_scales = value_scales.data_ptr<float>();
  const int64_t rows = query.size(0);
  if (query.scalar_type() == at::kFloat) {
    run<float, int8_t>(p, rows, vectorised);
  } else if (query.scalar_type() == at::kBFloat16) {
    run<c10::BFloat16, int8_t>(p, rows, vectorised);
  } else if (query.scalar_type() == at::kHalf) {
    run<c10::Half, int8_t>(p, rows, vectorised);
  } else {
    TORCH_CHECK(false, "paged_attention_int8: a float32, bfloat16 or float16 query only");
  }
}

bool has_vector_path() { return cpu_has_avx512f(); }

}  // namespace

#ifndef TRITONLM_OPS  // another namespace only to load two builds side by side (A/B of variants)
#define TRITONLM_OPS tritonlm_cpu
#endif

TORCH_LIBRARY(TRITONLM_OPS, m) {
  m.def(
      "paged_attention(Tensor(a!) out, Tensor query, Tensor keys, Tensor values, Tensor tables, Tensor row_seq, "
      "Tensor row_len, int block_size, float scale, bool vectorised) -> ()");
  m.def(
      "paged_attention_int8(Tensor(a!) out, Tensor query, Tensor keys, Tensor key_scales, Tensor values, "
      "Tensor value_scales, Tensor tables, Tensor row_seq, Tensor row_len, int block_size, float scale, "
      "bool vectorised) -> ()");
  m.def("has_vector_path() -> bool", has_vector_path);
}

TORCH_LIBRARY_IMPL(TRITONLM_OPS, CPU, m) {
  m.impl("paged_attention", paged_attention);
  m.impl("paged_attention_int8", paged_attention_int8);
}
