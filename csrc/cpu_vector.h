// What the CPU kernels (cpu_attention.cpp, cpu_layer_ops.cpp) share: fp32 conversions and the
// AVX-512F helpers. The AVX-512 code has a function-level target, so the library builds with the
// compiler's default flags and picks its loops at run time (cpu_has_avx512f).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#define TRITONLM_X86 1
#endif

namespace {

template <typename T>
inline float to_float(T x) {
  return static_cast<float>(x);
}

inline bool cpu_has_avx512f() {
#ifdef TRITONLM_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

#ifdef TRITONLM_X86
#define AVX512 __attribute__((target("avx512f")))

AVX512 inline __m512 load16(const float* x) { return _mm512_loadu_ps(x); }
AVX512 inline __m512 load16(const c10::BFloat16* x) {
  // bf16 is the top half of an fp32: widen and shift.
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
AVX512 inline __m512 load16(const c10::Half* x) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
}
AVX512 inline __m512 load16(const int8_t* x) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))));
}

// e^x: 2^n * e^r, |r| <= ln2 / 2, degree-7 Taylor polynomial (relative error ~1e-8, below fp32's
// rounding); x below -100 counts as -100 (e^-100 ~ 4e-44), above ~88.7 it is inf.
AVX512 inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-100.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 poly = _mm512_set1_ps(1.f / 5040);
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.f / 720));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.f / 120));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.f / 24));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.f / 6));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(0.5f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(poly, n);
}

// x rounded to the nearest bfloat16 (ties to even), kept as an fp32.
AVX512 inline __m512 round_bf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i up = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  return _mm512_castsi512_ps(_mm512_and_si512(up, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// As torch's flash attention does in bf16 and fp16: the weights that multiply the values are
// rounded to the storage type, their sum is not (greedy tokens then agree with transformers' own
// bf16 runs, which part from an fp32-weighted sum at near-ties).
template <typename T>
AVX512 inline __m512 round_like(__m512 w) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) return round_bf16(w);
  if constexpr (std::is_same_v<T, c10::Half>) return _mm512_cvtph_ps(_mm512_cvtps_ph(w, _MM_FROUND_TO_NEAREST_INT));
  return w;
}


// Stores 16 fp32 lanes as T, rounded to nearest (ties to even), as a tensor's `.to(T)` does.
AVX512 inline void store16(float* x, __m512 v) { _mm512_storeu_ps(x, v); }
AVX512 inline void store16(c10::BFloat16* x, __m512 v) {
  const __m512i bits = _mm512_srli_epi32(_mm512_castps_si512(round_bf16(v)), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(x), _mm512_cvtepi32_epi16(bits));
}
AVX512 inline void store16(c10::Half* x, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(x), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
#endif

}  // namespace
