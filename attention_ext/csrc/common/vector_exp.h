// exp for the softmax loops of the CPU kernels, written so that the compiler vectorises the
// loops that call it (the libm call would stay scalar). Used by centroid_attention.cpp,
// clustered_top_attention.cpp and lsh/lsh_cpu.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace vector_exp {

// Cephes' expf: range reduction by ln 2, a degree-6 polynomial; about 1 ulp. 0 below -87.3
// (where exp underflows to a denormal; -inf included), clipped at 88.3.
inline float exp_vectorisable(float x) {
  const bool underflow = x < -87.3f;
  x = std::min(std::max(x, -87.3f), 88.3f);
  // Round x / ln 2 to the nearest integer n by adding 1.5 * 2^23: the low bits of the sum
  // then hold n (exact for |n| < 2^22).
  const float shifted = x * 1.44269504088896341f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  const int32_t exponent = bits - 0x4B400000;
  const float r = x - n * 0.693359375f - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t scale_bits = (exponent + 127) << 23;
  float scale;
  std::memcpy(&scale, &scale_bits, sizeof scale);
  return underflow ? 0.0f : p * scale;
}

inline double exp_vectorisable(double x) { return std::exp(x); }

}  // namespace vector_exp
