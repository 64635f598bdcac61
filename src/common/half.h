// Host-side float16 / bfloat16 <-> float32 conversion (round to nearest even), so the CPU
// backend, the reference and the CLI need no compiler extension types.
#pragma once

#include <cstdint>
#include <cstring>

#include "params.h"

namespace evoattn {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t{h} << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_to_float(sign);
  // Subnormal: value = mant * 2^-24, exact in float32.
  const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

inline uint16_t float_to_fp16(float f) {
  const uint32_t u = float_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (a < 0x38800000u) {                        // below the smallest normal 2^-14
    // Subnormal or zero: scale (exactly) so one fp16 subnormal ulp, 2^-24, is one integer unit,
    // then round to nearest even by hand. A result of 1024 is the smallest normal's encoding.
    const float shifted = bits_to_float(a) * 16777216.0f;
    const uint32_t q = static_cast<uint32_t>(shifted);
    const float rem = shifted - static_cast<float>(q);
    uint32_t r = q;
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  const uint32_t rounding = 0xfffu + ((a >> 13) & 1u);
  return sign | static_cast<uint16_t>((a - 0x38000000u + rounding) >> 13);
}

// Reads element `i` of a float16/bfloat16/float32 buffer as float.
inline float load_as_float(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF16: return fp16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kBool: return static_cast<const uint8_t*>(base)[i] ? 0.0f : -__builtin_inff();
  }
  return 0.0f;
}

inline void store_from_float(void* base, DType t, int64_t i, float x) {
  switch (t) {
    case DType::kF16: static_cast<uint16_t*>(base)[i] = float_to_fp16(x); break;
    case DType::kBF16: static_cast<uint16_t*>(base)[i] = float_to_bf16(x); break;
    case DType::kF32: static_cast<float*>(base)[i] = x; break;
    case DType::kBool: static_cast<uint8_t*>(base)[i] = x != 0.0f; break;
  }
}

// Rounds a float to what storing it in `t` would keep.
inline float round_to(DType t, float x) {
  switch (t) {
    case DType::kF16: return fp16_to_float(float_to_fp16(x));
    case DType::kBF16: return bf16_to_float(float_to_bf16(x));
    default: return x;
  }
}

}  // namespace evoattn
