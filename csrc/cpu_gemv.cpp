// A projection at a few rows (decode at low concurrency): out [M, N] = x [M, K] @ weight [N, K]^T
// (+ bias), weight dense bf16, fp16 or fp32 as loaded, x in its dtype.
//
// At one to a few rows a projection is memory-bound: every weight is read once and used M times.
// oneDNN's blocked GEMM reads it well below the memory's speed there; this loop streams the weight
// once, row after row (one sequential stream per thread), for all M rows at once (their sums in
// registers), the weight rows split across torch's threads. Sums are fp32 (AVX-512 BF16's dot
// product of pairs where the CPU has it, else widened to fp32 and fused multiply-adds), the bias
// added in fp32 and the result rounded once to x's dtype, as oneDNN does; only the summation order
// differs from F.linear's, and a row's result does not depend on the other rows. Past 8 rows it
// takes 8 at a time (streaming the weight again): for many rows a blocked GEMM is faster, and the
// caller uses one (linear/gemv.py's MAX_ROWS).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>

#include "cpu_vector.h"

namespace {

constexpr int kMaxRows = 8;
// Weight bytes per parallel task at least: a 600 KB projection still splits across two threads,
// a tiny one does not pay for waking them.
constexpr int64_t kGrainBytes = 1 << 16;

enum Level : int64_t { kPlain = 0, kAvx512 = 1, kBest = 2 };

bool cpu_has_avx512_bf16() {
#ifdef TRITONLM_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
#else
  return false;
#endif
}

// What every loop computes for weight rows [n0, n1): sums [M][n] in fp32, then bias and the store.
template <typename T>
struct Job {
  const T* x;
  int64_t ldx;
  const T* w;
  int64_t K;
  const T* bias;
  T* out;
  int64_t ldo;
  int64_t M;
};

template <typename T>
inline void finish(const Job<T>& job, int64_t m, int64_t n, float sum) {
  if (job.bias != nullptr) sum += to_float(job.bias[n]);
  job.out[m * job.ldo + n] = static_cast<T>(sum);
}

// The K tail the vector loops leave (K not a multiple of their width): plain fp32 products.
template <typename T>
inline float tail(const Job<T>& job, int64_t m, int64_t n, int64_t k0) {
  float sum = 0.f;
  for (int64_t k = k0; k < job.K; ++k) sum += to_float(job.x[m * job.ldx + k]) * to_float(job.w[n * job.K + k]);
  return sum;
}

// ---- plain C++ ------------------------------------------------------------------------------
template <typename T>
void rows_plain(const Job<T>& job, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t m = 0; m < job.M; ++m) finish(job, m, n, tail(job, m, n, 0));
}

#ifdef TRITONLM_X86
// One weight row at a time, times the M rows: the weight is read as one sequential stream (the
// hardware prefetcher follows it; several rows' streams at once measured 1.5-2x slower from
// memory). U independent sums per row where M alone gives too few to hide the FMA's latency.
template <int M>
constexpr int kUnroll = M <= 2 ? 2 : 1;

// ---- AVX-512F: widen to fp32, fused multiply-add, 16 of K a step -----------------------------
template <typename T, int M>
AVX512 void row_fma(const Job<T>& job, int64_t n) {
  constexpr int U = kUnroll<M>;
  const T* w = job.w + n * job.K;
  __m512 acc[U][M];
  for (int u = 0; u < U; ++u)
    for (int m = 0; m < M; ++m) acc[u][m] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 * U <= job.K; k += 16 * U)
    for (int u = 0; u < U; ++u) {
      const __m512 wv = load16(w + k + 16 * u);
      for (int m = 0; m < M; ++m) acc[u][m] = _mm512_fmadd_ps(load16(job.x + m * job.ldx + k + 16 * u), wv, acc[u][m]);
    }
  for (; k + 16 <= job.K; k += 16) {
    const __m512 wv = load16(w + k);
    for (int m = 0; m < M; ++m) acc[0][m] = _mm512_fmadd_ps(load16(job.x + m * job.ldx + k), wv, acc[0][m]);
  }
  for (int m = 0; m < M; ++m) {
    for (int u = 1; u < U; ++u) acc[0][m] = _mm512_add_ps(acc[0][m], acc[u][m]);
    finish(job, m, n, _mm512_reduce_add_ps(acc[0][m]) + tail(job, m, n, k));
  }
}

// ---- AVX-512 BF16: dot products of bf16 pairs into fp32, 32 of K a step ----------------------
#define AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

AVX512_BF16 inline __m512bh load32(const c10::BFloat16* x) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(x));
}

template <int M>
AVX512_BF16 void row_dot(const Job<c10::BFloat16>& job, int64_t n) {
  constexpr int U = kUnroll<M>;
  const c10::BFloat16* w = job.w + n * job.K;
  __m512 acc[U][M];
  for (int u = 0; u < U; ++u)
    for (int m = 0; m < M; ++m) acc[u][m] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 * U <= job.K; k += 32 * U)
    for (int u = 0; u < U; ++u) {
      const __m512bh wv = load32(w + k + 32 * u);
      for (int m = 0; m < M; ++m) acc[u][m] = _mm512_dpbf16_ps(acc[u][m], load32(job.x + m * job.ldx + k + 32 * u), wv);
    }
  for (; k + 32 <= job.K; k += 32) {
    const __m512bh wv = load32(w + k);
    for (int m = 0; m < M; ++m) acc[0][m] = _mm512_dpbf16_ps(acc[0][m], load32(job.x + m * job.ldx + k), wv);
  }
  for (int m = 0; m < M; ++m) {
    for (int u = 1; u < U; ++u) acc[0][m] = _mm512_add_ps(acc[0][m], acc[u][m]);
    finish(job, m, n, _mm512_reduce_add_ps(acc[0][m]) + tail(job, m, n, k));
  }
}

template <typename T, int M, bool Dot>
void rows_vector(const Job<T>& job, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    if constexpr (!Dot) {
      row_fma<T, M>(job, n);
    } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
      row_dot<M>(job, n);
    }
  }
}

template <typename T, bool Dot>
using RowsFn = void (*)(const Job<T>&, int64_t, int64_t);

template <typename T, bool Dot, int... Ms>
RowsFn<T, Dot> pick_rows(int64_t M, std::integer_sequence<int, Ms...>) {
  RowsFn<T, Dot> fn = nullptr;
  ((fn = (M == Ms + 1) ? rows_vector<T, Ms + 1, Dot> : fn), ...);
  return fn;
}
#endif

// The loop for M (<= kMaxRows) rows at `level`.
template <typename T>
void (*rows_fn(int64_t M, int64_t level))(const Job<T>&, int64_t, int64_t) {
#ifdef TRITONLM_X86
  using Seq = std::make_integer_sequence<int, kMaxRows>;
  if constexpr (std::is_same_v<T, c10::BFloat16>)
    if (level >= kBest && cpu_has_avx512_bf16()) return pick_rows<T, true>(M, Seq{});
  if (level >= kAvx512 && cpu_has_avx512f()) return pick_rows<T, false>(M, Seq{});
#endif
  return rows_plain<T>;
}

template <typename T>
void gemv_typed(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                int64_t level) {
  const int64_t rows = x.size(0), N = weight.size(0), K = weight.size(1);
  const int64_t grain = std::max<int64_t>(1, kGrainBytes / std::max<int64_t>(1, K * int64_t(sizeof(T))));
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
    const int64_t M = std::min<int64_t>(kMaxRows, rows - r0);
    const Job<T> job{x.data_ptr<T>() + r0 * x.stride(0), x.stride(0), weight.data_ptr<T>(), K,
                     bias ? bias->data_ptr<T>() : nullptr, out.data_ptr<T>() + r0 * N, N, M};
    const auto fn = rows_fn<T>(M, level);
    at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) { fn(job, n0, n1); });
  }
}

// x [rows, K] (rows contiguous) @ weight [N, K]^T + bias [N] -> [rows, N] in x's dtype. `level`:
// 0 the plain C++ loop, 1 AVX-512F's fp32 loop, 2 the best this CPU has (the tests compare them).
at::Tensor gemv(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias, int64_t level) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, "gemv: x [rows, K] with contiguous rows");
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.size(1) == x.size(1),
              "gemv: weight [N, K], contiguous, x's K");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "gemv: weight in x's dtype");
  if (bias)
    TORCH_CHECK(bias->dim() == 1 && bias->is_contiguous() && bias->size(0) == weight.size(0) &&
                    bias->scalar_type() == x.scalar_type(),
                "gemv: bias [N], contiguous, x's dtype");
  at::Tensor out = at::empty({x.size(0), weight.size(0)}, x.options());
  switch (x.scalar_type()) {
    case at::kFloat: gemv_typed<float>(out, x, weight, bias, level); break;
    case at::kBFloat16: gemv_typed<c10::BFloat16>(out, x, weight, bias, level); break;
    case at::kHalf: gemv_typed<c10::Half>(out, x, weight, bias, level); break;
    default: TORCH_CHECK(false, "gemv: float32, bfloat16 or float16 only");
  }
  return out;
}

bool has_bf16_dot() { return cpu_has_avx512_bf16(); }

}  // namespace

#ifndef TRITONLM_OPS
#define TRITONLM_OPS tritonlm_cpu
#endif

TORCH_LIBRARY_FRAGMENT(TRITONLM_OPS, m) {
  m.def("gemv(Tensor x, Tensor weight, Tensor? bias, int level) -> Tensor");
  m.def("has_bf16_dot() -> bool", has_bf16_dot);
}

TORCH_LIBRARY_IMPL(TRITONLM_OPS, CPU, m) { m.impl("gemv", gemv); }
