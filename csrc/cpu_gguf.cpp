// GGUF's Q8_0 and Q6_K weights multiplied as they are stored (linear/gguf.py): out [M, N] =
// x [M, K] @ W [N, K]^T (+ bias), W as the file's blocks, uint8 [N, bytes per row], each row a run of
// blocks along K (llama.cpp's ggml-common.h):
//
// - Q8_0, 34 bytes per 32 values: d (fp16), 32 int8 q; value = d·q.
// - Q6_K, 210 bytes per 256 values: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], d
//   (fp16); value = (d·scale)·(q - 32), each 16 values one scale. Value i of a block: half h = i / 128,
//   group g = i % 128 / 32 and l = i % 32 in it: low bits from ql[64h + 32(g & 1) + l] (its high
//   nibble for g >= 2), high bits (qh[32h + l] >> 2g) & 3, scale scales[8h + 2g + l / 16].
//
// The layout is the file's (no repacking): each loop reads a row's blocks in order. Values are made in
// fp32 in the gguf package's own order of rounding (d·scale, then ·q), so a weight equals
// `gguf.quants.dequantize`'s exactly. `gguf_gemv` (decode, a few rows) streams each weight row once
// for all M rows (up to 8 at a time), decoding in registers; x·w summed in fp32 (a block's or 16
// values' scale applied to their sum: the same products, another order of rounding), the bias added
// and the result rounded once to x's dtype. `gguf_dequantize` writes rows of W to a dense tensor
// (prefill: the caller multiplies a tile of them with torch's GEMM). Both split the rows of W across
// torch's threads. Levels: 0 plain C++ (the tests force it), 1 AVX-512F, 2 the best this CPU has
// (AVX-512 BF16: Q6_K's dot products with bf16 x, bf16 stores).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "cpu_vector.h"

namespace {

// GGML's type numbers (gguf.GGMLQuantizationType), as the Python side passes them.
constexpr int64_t kQ8_0 = 8;
constexpr int64_t kQ6_K = 14;
constexpr int kMaxRows = 8;
constexpr int64_t kGrainBytes = 1 << 16;  // weight bytes per parallel task at least (as cpu_gemv's)

struct Format {
  int64_t values;  // per block
  int64_t bytes;   // per block
};

Format format_of(int64_t kind) {
  if (kind == kQ8_0) return {32, 34};
  TORCH_CHECK(kind == kQ6_K, "gguf kernels: block type ", kind, " is not Q8_0 (8) or Q6_K (14)");
  return {256, 210};
}

inline float fp16(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// ---- plain C++: one value at a time ---------------------------------------------------------
template <int64_t Kind>
inline void decode_block_plain(const uint8_t* b, float* w) {
  if constexpr (Kind == kQ8_0) {
    const float d = fp16(b);
    for (int i = 0; i < 32; ++i) w[i] = d * static_cast<float>(static_cast<int8_t>(b[2 + i]));
  } else {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    const float d = fp16(b + 208);
    for (int i = 0; i < 256; ++i) {
      const int h = i / 128, g = i % 128 / 32, l = i % 32;
      const uint8_t low = ql[64 * h + 32 * (g & 1) + l];
      const int q = ((g >= 2 ? low >> 4 : low & 0xF) | (((qh[32 * h + l] >> (2 * g)) & 3) << 4)) - 32;
      w[i] = (d * static_cast<float>(sc[8 * h + 2 * g + l / 16])) * static_cast<float>(q);
    }
  }
}

#ifdef TRITONLM_X86
// ---- AVX-512F: chunk c (16 values) of a block in fp32 ----------------------------------------
AVX512 inline __m512 bytes16(const uint8_t* p) {
  return _mm512_castsi512_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

template <int64_t Kind>
AVX512 inline __m512 decode16(const uint8_t* b, int c, float d) {
  if constexpr (Kind == kQ8_0) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + 16 * c));
    return _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
  } else {
    const int h = c / 8, g = c % 8 / 2, s = c % 2;
    __m512i low = _mm512_castps_si512(bytes16(b + 64 * h + 32 * (g & 1) + 16 * s));
    low = _mm512_and_si512(_mm512_srli_epi32(low, g >= 2 ? 4 : 0), _mm512_set1_epi32(0xF));
    __m512i high = _mm512_castps_si512(bytes16(b + 128 + 32 * h + 16 * s));
    high = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(high, 2 * g), _mm512_set1_epi32(3)), 4);
    const __m512i q = _mm512_sub_epi32(_mm512_or_si512(low, high), _mm512_set1_epi32(32));
    const float scale = d * static_cast<float>(reinterpret_cast<const int8_t*>(b + 192)[8 * h + 2 * g + s]);
    return _mm512_mul_ps(_mm512_set1_ps(scale), _mm512_cvtepi32_ps(q));
  }
}

template <int64_t Kind>
constexpr int kChunks = Kind == kQ8_0 ? 2 : 16;
template <int64_t Kind>
constexpr int kDOffset = Kind == kQ8_0 ? 0 : 208;
#endif

// What a loop computes for weight rows [n0, n1): x as fp32 rows (converted once), sums in fp32.
template <typename T>
struct Job {
  const float* x;                // [M, K]
  const c10::BFloat16* x_bf16;   // [M, K], x as given where it is bfloat16 (the Q6_K dot loop), else null
  const uint8_t* w;
  int64_t row_bytes;
  int64_t K;
  const T* bias;
  T* out;
  int64_t ldo;
  int64_t M;
};

template <typename T>
inline void finish(const Job<T>& job, int64_t m, int64_t n, float sum) {
  if (job.bias != nullptr) sum += static_cast<float>(job.bias[n]);
  job.out[m * job.ldo + n] = static_cast<T>(sum);
}

template <typename T, int64_t Kind>
void rows_plain(const Job<T>& job, int64_t n0, int64_t n1) {
  constexpr Format f = Kind == kQ8_0 ? Format{32, 34} : Format{256, 210};
  float w[f.values];
  std::vector<float> sums(job.M);
  for (int64_t n = n0; n < n1; ++n) {
    std::fill(sums.begin(), sums.end(), 0.f);
    for (int64_t k0 = 0; k0 < job.K; k0 += f.values) {
      decode_block_plain<Kind>(job.w + n * job.row_bytes + k0 / f.values * f.bytes, w);
      for (int64_t m = 0; m < job.M; ++m)
        for (int64_t i = 0; i < f.values; ++i) sums[m] += job.x[m * job.K + k0 + i] * w[i];
    }
    for (int64_t m = 0; m < job.M; ++m) finish(job, m, n, sums[m]);
  }
}

#ifdef TRITONLM_X86
// One weight row at a time (one sequential stream), each 16 values decoded once for the M rows.
// Q6_K: two sets of sums (even and odd chunks) so that one row alone does not wait on the FMA.
template <typename T, int64_t Kind, int M>
AVX512 void rows_vector(const Job<T>& job, int64_t n0, int64_t n1) {
  constexpr Format f = Kind == kQ8_0 ? Format{32, 34} : Format{256, 210};
  for (int64_t n = n0; n < n1; ++n) {
    __m512 acc[2][M];
    for (int u = 0; u < 2; ++u)
      for (int m = 0; m < M; ++m) acc[u][m] = _mm512_setzero_ps();
    const uint8_t* row = job.w + n * job.row_bytes;
    for (int64_t k0 = 0; k0 < job.K; k0 += f.values) {
      const uint8_t* b = row + k0 / f.values * f.bytes;
      const float d = fp16(b + kDOffset<Kind>);
      if constexpr (Kind == kQ8_0) {
        // d·(Σ x·q): the block's one scale after its sum (d·q is exact in fp32: same products).
        const __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2))));
        const __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18))));
        const __m512 dv = _mm512_set1_ps(d);
        const int u = (k0 / 32) & 1;
        for (int m = 0; m < M; ++m) {
          const float* x = job.x + m * job.K + k0;
          const __m512 sum = _mm512_fmadd_ps(_mm512_loadu_ps(x + 16), w1, _mm512_mul_ps(_mm512_loadu_ps(x), w0));
          acc[u][m] = _mm512_fmadd_ps(sum, dv, acc[u][m]);
        }
      } else {
        for (int c = 0; c < kChunks<Kind>; ++c) {
          const __m512 w = decode16<Kind>(b, c, d);
          for (int m = 0; m < M; ++m)
            acc[c & 1][m] = _mm512_fmadd_ps(_mm512_loadu_ps(job.x + m * job.K + k0 + 16 * c), w, acc[c & 1][m]);
        }
      }
    }
    for (int m = 0; m < M; ++m) finish(job, m, n, _mm512_reduce_add_ps(_mm512_add_ps(acc[0][m], acc[1][m])));
  }
}

// ---- AVX-512 BF16, Q6_K with bfloat16 x: 32 values a step ------------------------------------
// Each value's 6 bits, gathered into a 16-bit lane, index a 64-entry table of bf16(q - 32) (exact)
// in two registers (one vpermt2w); the x·(q - 32) pairs are summed in fp32 by the dot-product
// instruction (products of bf16s are exact), then each 16 values' sum times its scale d·scale.
#define AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

bool cpu_has_avx512_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
}

template <typename T, int M>
AVX512_BF16 void rows_q6k_dot(const Job<T>& job, int64_t n0, int64_t n1) {
  alignas(64) uint16_t table[64];
  for (int u = 0; u < 64; ++u) table[u] = c10::BFloat16(static_cast<float>(u - 32)).x;
  const __m512i low_table = _mm512_load_si512(table), high_table = _mm512_load_si512(table + 32);
  const __m512i nibble = _mm512_set1_epi16(0x0F);
  for (int64_t n = n0; n < n1; ++n) {
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    const uint8_t* row = job.w + n * job.row_bytes;
    for (int64_t k0 = 0; k0 < job.K; k0 += 256) {
      const uint8_t* b = row + k0 / 256 * 210;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = fp16(b + 208);
      for (int h = 0; h < 2; ++h) {
        const __m512i qh = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h)));
        for (int g = 0; g < 4; ++g) {
          __m512i ql = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32 * (g & 1))));
          if (g >= 2) ql = _mm512_srli_epi16(ql, 4);
          // qh's bits 2g, 2g + 1 to bits 4, 5 (the table reads the low 6 bits only).
          const __m512i high = g < 3 ? _mm512_slli_epi16(qh, 4 - 2 * g) : _mm512_srli_epi16(qh, 2);
          const __m512i index = _mm512_ternarylogic_epi32(nibble, ql, high, 0xCA);  // nibble ? ql : high
          const __m512bh w = reinterpret_cast<__m512bh>(_mm512_permutex2var_epi16(low_table, index, high_table));
          const float s0 = d * static_cast<float>(sc[8 * h + 2 * g]), s1 = d * static_cast<float>(sc[8 * h + 2 * g + 1]);
          const __m512 scale = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(s0), _mm512_set1_ps(s1));
          for (int m = 0; m < M; ++m) {
            const __m512bh x = reinterpret_cast<__m512bh>(
                _mm512_loadu_si512(job.x_bf16 + m * job.K + k0 + 128 * h + 32 * g));
            acc[m] = _mm512_fmadd_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), x, w), scale, acc[m]);
          }
        }
      }
    }
    for (int m = 0; m < M; ++m) finish(job, m, n, _mm512_reduce_add_ps(acc[m]));
  }
}

template <typename T, int64_t Kind, bool Dot, int... Ms>
void (*pick_rows(int64_t M, std::integer_sequence<int, Ms...>))(const Job<T>&, int64_t, int64_t) {
  void (*fn)(const Job<T>&, int64_t, int64_t) = nullptr;
  if constexpr (Dot)
    ((fn = (M == Ms + 1) ? rows_q6k_dot<T, Ms + 1> : fn), ...);
  else
    ((fn = (M == Ms + 1) ? rows_vector<T, Kind, Ms + 1> : fn), ...);
  return fn;
}
#endif

template <typename T, int64_t Kind>
void (*rows_fn(int64_t M, int64_t level))(const Job<T>&, int64_t, int64_t) {
#ifdef TRITONLM_X86
  using Seq = std::make_integer_sequence<int, kMaxRows>;
  if constexpr (Kind == kQ6_K && std::is_same_v<T, c10::BFloat16>)
    if (level >= 2 && cpu_has_avx512_bf16()) return pick_rows<T, Kind, true>(M, Seq{});
  if (level >= 1 && cpu_has_avx512f()) return pick_rows<T, Kind, false>(M, Seq{});
#endif
  return rows_plain<T, Kind>;
}

int64_t grain_of(int64_t row_bytes) { return std::max<int64_t>(1, kGrainBytes / std::max<int64_t>(1, row_bytes)); }

template <typename T, int64_t Kind>
void gemv_typed(at::Tensor& out, const at::Tensor& x, const at::Tensor& blocks, const std::optional<at::Tensor>& bias,
                int64_t level) {
  const int64_t rows = x.size(0), N = blocks.size(0), K = x.size(1), row_bytes = blocks.size(1);
  const at::Tensor xf = x.to(at::kFloat).contiguous();  // converted once, not per weight row
  const at::Tensor xb = x.scalar_type() == at::kBFloat16 ? x.contiguous() : at::Tensor();
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
    const int64_t M = std::min<int64_t>(kMaxRows, rows - r0);
    const c10::BFloat16* x_bf16 = xb.defined() ? xb.data_ptr<c10::BFloat16>() + r0 * K : nullptr;
    const Job<T> job{xf.data_ptr<float>() + r0 * K, x_bf16, blocks.data_ptr<uint8_t>(), row_bytes, K,
                     bias ? bias->data_ptr<T>() : nullptr, out.data_ptr<T>() + r0 * N, N, M};
    const auto fn = rows_fn<T, Kind>(M, level);
    at::parallel_for(0, N, grain_of(row_bytes), [&](int64_t n0, int64_t n1) { fn(job, n0, n1); });
  }
}

void check_blocks(const at::Tensor& blocks, int64_t kind, int64_t K, const char* op) {
  const Format f = format_of(kind);
  TORCH_CHECK(blocks.dim() == 2 && blocks.is_contiguous() && blocks.scalar_type() == at::kByte, op,
              ": blocks uint8 [N, bytes per row], contiguous");
  TORCH_CHECK(K % f.values == 0 && blocks.size(1) == K / f.values * f.bytes, op, ": ", K,
              " inputs are not the blocks' ", blocks.size(1), " bytes per row");
}

// x [rows, K] @ W^T + bias -> [rows, N] in x's dtype (float32 or bfloat16). `level`: 0 the plain C++
// loop, 1 AVX-512F's fp32 loop, 2 the best this CPU has (Q6_K with bf16 x: AVX-512 BF16's dot
// products), where the CPU has them (the tests compare them).
at::Tensor gguf_gemv(const at::Tensor& x, const at::Tensor& blocks, int64_t kind, const std::optional<at::Tensor>& bias,
                     int64_t level) {
  TORCH_CHECK(x.dim() == 2, "gguf_gemv: x [rows, K]");
  check_blocks(blocks, kind, x.size(1), "gguf_gemv");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, "gguf_gemv: x float32 or bfloat16");
  if (bias)
    TORCH_CHECK(bias->dim() == 1 && bias->is_contiguous() && bias->size(0) == blocks.size(0) &&
                    bias->scalar_type() == x.scalar_type(),
                "gguf_gemv: bias [N], contiguous, x's dtype");
  at::Tensor out = at::empty({x.size(0), blocks.size(0)}, x.options());
  const bool q8 = kind == kQ8_0;
  if (x.scalar_type() == at::kFloat)
    q8 ? gemv_typed<float, kQ8_0>(out, x, blocks, bias, level) : gemv_typed<float, kQ6_K>(out, x, blocks, bias, level);
  else
    q8 ? gemv_typed<c10::BFloat16, kQ8_0>(out, x, blocks, bias, level)
       : gemv_typed<c10::BFloat16, kQ6_K>(out, x, blocks, bias, level);
  return out;
}

#ifdef TRITONLM_X86
// Rows of W as bf16, 32 values a step rounded by AVX-512 BF16's conversion (ties to even, as `.to`).
template <int64_t Kind>
AVX512_BF16 void dequantize_bf16(c10::BFloat16* out, const uint8_t* blocks, int64_t row_bytes, int64_t K, int64_t n0,
                                 int64_t n1) {
  constexpr Format f = Kind == kQ8_0 ? Format{32, 34} : Format{256, 210};
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t k0 = 0; k0 < K; k0 += f.values) {
      const uint8_t* b = blocks + n * row_bytes + k0 / f.values * f.bytes;
      const float d = fp16(b + kDOffset<Kind>);
      for (int c = 0; c < kChunks<Kind>; c += 2) {
        const __m512bh pair = _mm512_cvtne2ps_pbh(decode16<Kind>(b, c + 1, d), decode16<Kind>(b, c, d));
        _mm512_storeu_si512(out + n * K + k0 + 16 * c, reinterpret_cast<__m512i>(pair));
      }
    }
}
#endif

// ---- dequantize: rows of W into a dense [N, K] tensor ----------------------------------------
template <typename T, int64_t Kind>
void dequantize_plain(T* out, const uint8_t* blocks, int64_t row_bytes, int64_t K, int64_t n0, int64_t n1) {
  constexpr Format f = Kind == kQ8_0 ? Format{32, 34} : Format{256, 210};
  float w[f.values];
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t k0 = 0; k0 < K; k0 += f.values) {
      decode_block_plain<Kind>(blocks + n * row_bytes + k0 / f.values * f.bytes, w);
      for (int64_t i = 0; i < f.values; ++i) out[n * K + k0 + i] = static_cast<T>(w[i]);
    }
}

#ifdef TRITONLM_X86
template <typename T, int64_t Kind>
AVX512 void dequantize_vector(T* out, const uint8_t* blocks, int64_t row_bytes, int64_t K, int64_t n0, int64_t n1) {
  constexpr Format f = Kind == kQ8_0 ? Format{32, 34} : Format{256, 210};
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t k0 = 0; k0 < K; k0 += f.values) {
      const uint8_t* b = blocks + n * row_bytes + k0 / f.values * f.bytes;
      const float d = fp16(b + kDOffset<Kind>);
      for (int c = 0; c < kChunks<Kind>; ++c) store16(out + n * K + k0 + 16 * c, decode16<Kind>(b, c, d));
    }
}
#endif

template <typename T, int64_t Kind>
void dequantize_rows(T* out, const uint8_t* blocks, int64_t row_bytes, int64_t K, int64_t n0, int64_t n1,
                     int64_t level) {
#ifdef TRITONLM_X86
  if constexpr (std::is_same_v<T, c10::BFloat16>)
    if (level >= 2 && cpu_has_avx512_bf16()) return dequantize_bf16<Kind>(out, blocks, row_bytes, K, n0, n1);
  if (level >= 1 && cpu_has_avx512f()) return dequantize_vector<T, Kind>(out, blocks, row_bytes, K, n0, n1);
#endif
  dequantize_plain<T, Kind>(out, blocks, row_bytes, K, n0, n1);
}

template <typename T>
void dequantize_typed(at::Tensor& out, const at::Tensor& blocks, int64_t kind, int64_t level) {
  const int64_t K = out.size(1), row_bytes = blocks.size(1);
  T* dst = out.data_ptr<T>();
  const uint8_t* src = blocks.data_ptr<uint8_t>();
  at::parallel_for(0, blocks.size(0), grain_of(row_bytes), [&](int64_t n0, int64_t n1) {
    kind == kQ8_0 ? dequantize_rows<T, kQ8_0>(dst, src, row_bytes, K, n0, n1, level)
                  : dequantize_rows<T, kQ6_K>(dst, src, row_bytes, K, n0, n1, level);
  });
}

// out [N, K] (float32 or bfloat16, contiguous) = the values of blocks [N, bytes per row].
void gguf_dequantize(at::Tensor& out, const at::Tensor& blocks, int64_t kind, int64_t level) {
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.size(0) == blocks.size(0),
              "gguf_dequantize: out [N, K], contiguous, the blocks' N");
  check_blocks(blocks, kind, out.size(1), "gguf_dequantize");
  if (out.scalar_type() == at::kFloat)
    dequantize_typed<float>(out, blocks, kind, level);
  else if (out.scalar_type() == at::kBFloat16)
    dequantize_typed<c10::BFloat16>(out, blocks, kind, level);
  else
    TORCH_CHECK(false, "gguf_dequantize: out float32 or bfloat16");
}

}  // namespace

#ifndef TRITONLM_OPS
#define TRITONLM_OPS tritonlm_cpu
#endif

TORCH_LIBRARY_FRAGMENT(TRITONLM_OPS, m) {
  m.def("gguf_gemv(Tensor x, Tensor blocks, int kind, Tensor? bias, int level) -> Tensor");
  m.def("gguf_dequantize(Tensor(a!) out, Tensor blocks, int kind, int level) -> ()");
}

TORCH_LIBRARY_IMPL(TRITONLM_OPS, CPU, m) {
  m.impl("gguf_gemv", gguf_gemv);
  m.impl("gguf_dequantize", gguf_dequantize);
}
