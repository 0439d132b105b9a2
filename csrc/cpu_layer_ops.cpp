// A decoder layer's elementwise work on the CPU, one pass each: the kernels behind
// tritonlm/worker/fused.py's RMSNorm and SiLU-and-mul, and tritonlm/worker/model_paths/decoder_stack.py's
// residual add + RMSNorm and rotary embedding.
//
// torch runs transformers' RMSNorm as six operations (to fp32, square, mean, rsqrt, multiply,
// back, times the weight), SiLU-and-mul as two and the rotary embedding as seven, each a pass over
// memory; in bf16 each converts too. Here each is one pass per row, computing what those operations
// compute: fp32 arithmetic, rounded to the storage type where transformers rounds (the sum of the
// residual and the layer's output; the normalised row before the weight multiplies it; the SiLU
// before the product; each product of the rotary embedding, then their sum), so results differ
// from torch's only by the order of the sum of squares and by the last bit of e^x. The library
// builds with -ffp-contract=off, so no product and sum are fused where torch rounds between them.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "cpu_vector.h"

namespace {

// Elements per parallel task: below this, one thread does the rows (a decode step's 32 rows
// would spend more on waking threads than on arithmetic).
constexpr int64_t kGrain = 1 << 15;

template <typename T>
inline T to(float x) {
  return static_cast<T>(x);
}

// ---- plain C++ ------------------------------------------------------------------------------
template <typename T>
void rms_norm_row_plain(const T* x, const T* weight, T* out, int64_t n, float eps) {
  float squares = 0.f;
  for (int64_t i = 0; i < n; ++i) squares += to_float(x[i]) * to_float(x[i]);
  const float inverse = 1.f / std::sqrt(squares / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = to<T>(to_float(weight[i]) * to_float(to<T>(to_float(x[i]) * inverse)));
}

template <typename T>
void add_row_plain(T* residual, const T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) residual[i] = to<T>(to_float(residual[i]) + to_float(x[i]));
}

// transformers' rotate_half form: out[i] = x[i] cos[i] - x[i + h] sin[i], out[i + h] = x[i + h]
// cos[i + h] + x[i] sin[i + h], h = n / 2, each product rounded to T, then the sum.
template <typename T>
void rotary_row_plain(T* x, const T* cos, const T* sin, int64_t n) {
  const int64_t h = n / 2;
  for (int64_t i = 0; i < h; ++i) {
    const float a = to_float(x[i]), b = to_float(x[i + h]);
    x[i] = to<T>(to_float(to<T>(a * to_float(cos[i]))) + to_float(to<T>(-b * to_float(sin[i]))));
    x[i + h] = to<T>(to_float(to<T>(b * to_float(cos[i + h]))) + to_float(to<T>(a * to_float(sin[i + h]))));
  }
}

template <typename T>
void silu_and_mul_row_plain(const T* gate, const T* up, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = to_float(gate[i]);
    out[i] = to<T>(to_float(to<T>(g / (1.f + std::exp(-g)))) * to_float(up[i]));
  }
}

// ---- AVX-512F -------------------------------------------------------------------------------
#ifdef TRITONLM_X86
template <typename T>
AVX512 void rms_norm_row_avx512(const T* x, const T* weight, T* out, int64_t n, float eps) {
  __m512 squares = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = load16(x + i);
    squares = _mm512_fmadd_ps(v, v, squares);
  }
  const float inverse = 1.f / std::sqrt(_mm512_reduce_add_ps(squares) / static_cast<float>(n) + eps);
  const __m512 scale = _mm512_set1_ps(inverse);
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 normed = round_like<T>(_mm512_mul_ps(load16(x + i), scale));
    store16(out + i, _mm512_mul_ps(load16(weight + i), normed));
  }
}

template <typename T>
AVX512 void add_row_avx512(T* residual, const T* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) store16(residual + i, _mm512_add_ps(load16(residual + i), load16(x + i)));
}

// n / 2 a multiple of 16.
template <typename T>
AVX512 void rotary_row_avx512(T* x, const T* cos, const T* sin, int64_t n) {
  const int64_t h = n / 2;
  for (int64_t i = 0; i < h; i += 16) {
    const __m512 a = load16(x + i), b = load16(x + i + h);
    const __m512 low = _mm512_add_ps(round_like<T>(_mm512_mul_ps(a, load16(cos + i))),
                                     round_like<T>(_mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), b), load16(sin + i))));
    const __m512 high = _mm512_add_ps(round_like<T>(_mm512_mul_ps(b, load16(cos + i + h))),
                                      round_like<T>(_mm512_mul_ps(a, load16(sin + i + h))));
    store16(x + i, low);
    store16(x + i + h, high);
  }
}

template <typename T>
AVX512 void silu_and_mul_row_avx512(const T* gate, const T* up, T* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.f);
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 g = load16(gate + i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 silu = round_like<T>(_mm512_div_ps(g, _mm512_add_ps(one, e)));
    store16(out + i, _mm512_mul_ps(silu, load16(up + i)));
  }
}
#endif

// The AVX-512 loop needs rows of whole 16-lane vectors.
bool vector_rows(int64_t n, bool vectorised) { return vectorised && n % 16 == 0 && cpu_has_avx512f(); }

void check_rows(const at::Tensor& t, const at::Tensor& like, const char* name) {
  TORCH_CHECK(t.dim() == 2 && t.stride(1) == 1, name, ": [rows, n] with contiguous rows");
  TORCH_CHECK(t.size(0) == like.size(0) && t.scalar_type() == like.scalar_type(), name, ": one row count and dtype");
}

template <typename F>
void for_rows(int64_t rows, int64_t n, const F& row) {
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) row(r);
  });
}

template <typename T>
void rms_norm_typed(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, float eps, bool vectorised) {
  const int64_t rows = x.size(0), n = x.size(1);
  const T* xs = x.data_ptr<T>();
  const T* w = weight.data_ptr<T>();
  T* os = out.data_ptr<T>();
  auto row_fn = rms_norm_row_plain<T>;
#ifdef TRITONLM_X86
  if (vector_rows(n, vectorised)) row_fn = rms_norm_row_avx512<T>;
#endif
  for_rows(rows, n, [&](int64_t r) { row_fn(xs + r * x.stride(0), w, os + r * out.stride(0), n, eps); });
}

template <typename T>
void silu_and_mul_typed(at::Tensor& out, const at::Tensor& gate, const at::Tensor& up, bool vectorised) {
  const int64_t rows = gate.size(0), n = gate.size(1);
  const T* g = gate.data_ptr<T>();
  const T* u = up.data_ptr<T>();
  T* os = out.data_ptr<T>();
  auto row_fn = silu_and_mul_row_plain<T>;
#ifdef TRITONLM_X86
  if (vector_rows(n, vectorised)) row_fn = silu_and_mul_row_avx512<T>;
#endif
  for_rows(rows, n, [&](int64_t r) {
    row_fn(g + r * gate.stride(0), u + r * up.stride(0), os + r * out.stride(0), n);
  });
}

template <typename T>
void add_rms_norm_typed(at::Tensor& out, at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, float eps,
                        bool vectorised) {
  const int64_t rows = x.size(0), n = x.size(1);
  T* rs = residual.data_ptr<T>();
  const T* xs = x.data_ptr<T>();
  const T* w = weight.data_ptr<T>();
  T* os = out.data_ptr<T>();
  auto add_fn = add_row_plain<T>;
  auto norm_fn = rms_norm_row_plain<T>;
#ifdef TRITONLM_X86
  if (vector_rows(n, vectorised)) {
    add_fn = add_row_avx512<T>;
    norm_fn = rms_norm_row_avx512<T>;
  }
#endif
  for_rows(rows, n, [&](int64_t r) {
    T* row = rs + r * residual.stride(0);
    add_fn(row, xs + r * x.stride(0), n);
    norm_fn(row, w, os + r * out.stride(0), n, eps);
  });
}

template <typename T>
void rotary_typed(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool vectorised) {
  const int64_t tokens = x.size(0), heads = x.size(1), n = x.size(2);
  T* xs = x.data_ptr<T>();
  const T* c = cos.data_ptr<T>();
  const T* s = sin.data_ptr<T>();
  auto row_fn = rotary_row_plain<T>;
#ifdef TRITONLM_X86
  if (vector_rows(n / 2, vectorised)) row_fn = rotary_row_avx512<T>;
#endif
  for_rows(tokens * heads, n, [&](int64_t r) {
    const int64_t t = r / heads, head = r % heads;
    row_fn(xs + t * x.stride(0) + head * x.stride(1), c + t * n, s + t * n, n);
  });
}

// out [rows, n] = weight * to_T(x * rsqrt(mean(x^2) + eps)), each row of x [rows, n] (transformers'
// LlamaRMSNorm). `vectorised`: the AVX-512 loop where it can run.
void rms_norm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps, bool vectorised) {
  check_rows(x, x, "x");
  check_rows(out, x, "out");
  TORCH_CHECK(weight.dim() == 1 && weight.is_contiguous() && weight.size(0) == x.size(1), "weight: [n], contiguous");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && out.size(1) == x.size(1), "weight, out: x's dtype and n");
  const float e = static_cast<float>(eps);
  switch (x.scalar_type()) {
    case at::kFloat: return rms_norm_typed<float>(out, x, weight, e, vectorised);
    case at::kBFloat16: return rms_norm_typed<c10::BFloat16>(out, x, weight, e, vectorised);
    case at::kHalf: return rms_norm_typed<c10::Half>(out, x, weight, e, vectorised);
    default: TORCH_CHECK(false, "rms_norm: float32, bfloat16 or float16 only");
  }
}

// residual [rows, n] = to_T(residual + x), then out = rms_norm(residual) (transformers' decoder
// layer: the residual stream after a block, normalised for the next).
void add_rms_norm(at::Tensor& out, at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, double eps,
                  bool vectorised) {
  check_rows(residual, residual, "residual");
  check_rows(x, residual, "x");
  check_rows(out, residual, "out");
  TORCH_CHECK(weight.dim() == 1 && weight.is_contiguous() && weight.size(0) == residual.size(1), "weight: [n], contiguous");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && out.size(1) == x.size(1) && x.size(1) == residual.size(1),
              "weight, x, out: residual's dtype and n");
  const float e = static_cast<float>(eps);
  switch (x.scalar_type()) {
    case at::kFloat: return add_rms_norm_typed<float>(out, residual, x, weight, e, vectorised);
    case at::kBFloat16: return add_rms_norm_typed<c10::BFloat16>(out, residual, x, weight, e, vectorised);
    case at::kHalf: return add_rms_norm_typed<c10::Half>(out, residual, x, weight, e, vectorised);
    default: TORCH_CHECK(false, "add_rms_norm: float32, bfloat16 or float16 only");
  }
}

// x [tokens, heads, n] (rows contiguous; e.g. the query and key heads of a fused projection's
// output) rotated in place by cos, sin [tokens, n] (contiguous, x's dtype): transformers'
// apply_rotary_pos_emb with rotate_half.
void rotary(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool vectorised) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && x.size(2) % 2 == 0, "x: [tokens, heads, n], rows contiguous, n even");
  for (const at::Tensor* t : {&cos, &sin})
    TORCH_CHECK(t->dim() == 2 && t->is_contiguous() && t->size(0) == x.size(0) && t->size(1) == x.size(2) &&
                    t->scalar_type() == x.scalar_type(),
                "cos, sin: [tokens, n], contiguous, x's dtype");
  switch (x.scalar_type()) {
    case at::kFloat: return rotary_typed<float>(x, cos, sin, vectorised);
    case at::kBFloat16: return rotary_typed<c10::BFloat16>(x, cos, sin, vectorised);
    case at::kHalf: return rotary_typed<c10::Half>(x, cos, sin, vectorised);
    default: TORCH_CHECK(false, "rotary: float32, bfloat16 or float16 only");
  }
}

// out [rows, n] = to_T(silu(gate)) * up, gate and up [rows, n] (transformers' SiLU MLP before its
// down projection; gate and up may be the two halves of one fused projection's output).
void silu_and_mul(at::Tensor& out, const at::Tensor& gate, const at::Tensor& up, bool vectorised) {
  check_rows(gate, gate, "gate");
  check_rows(up, gate, "up");
  check_rows(out, gate, "out");
  TORCH_CHECK(up.size(1) == gate.size(1) && out.size(1) == gate.size(1), "gate, up, out: one width");
  switch (gate.scalar_type()) {
    case at::kFloat: return silu_and_mul_typed<float>(out, gate, up, vectorised);
    case at::kBFloat16: return silu_and_mul_typed<c10::BFloat16>(out, gate, up, vectorised);
    case at::kHalf: return silu_and_mul_typed<c10::Half>(out, gate, up, vectorised);
    default: TORCH_CHECK(false, "silu_and_mul: float32, bfloat16 or float16 only");
  }
}

}  // namespace

#ifndef TRITONLM_OPS
#define TRITONLM_OPS tritonlm_cpu
#endif

TORCH_LIBRARY_FRAGMENT(TRITONLM_OPS, m) {
  m.def("rms_norm(Tensor(a!) out, Tensor x, Tensor weight, float eps, bool vectorised) -> ()");
  m.def("silu_and_mul(Tensor(a!) out, Tensor gate, Tensor up, bool vectorised) -> ()");
  m.def("add_rms_norm(Tensor(a!) out, Tensor(b!) residual, Tensor x, Tensor weight, float eps, bool vectorised) -> ()");
  m.def("rotary(Tensor(a!) x, Tensor cos, Tensor sin, bool vectorised) -> ()");
}

TORCH_LIBRARY_IMPL(TRITONLM_OPS, CPU, m) {
  m.impl("rms_norm", rms_norm);
  m.impl("silu_and_mul", silu_and_mul);
  m.impl("add_rms_norm", add_rms_norm);
  m.impl("rotary", rotary);
}
