// Exact scalar conversions between float32 and the storage dtypes the kernels move.
//
// Written with integer arithmetic only (no cuda_fp16.h / cuda_bf16.h / cuda_fp8.h) so
// that one definition compiles under nvcc, NVRTC (CuPy) and a plain host compiler,
// and so that tests can run it on a CPU and compare it bit for bit with torch:
//   * float32 -> bfloat16 and float16: round to nearest even (torch's rule).
//   * float32 -> float8 e4m3fn: round to nearest even, saturating to +-448
//     (callers clamp first, which makes torch's non-saturating cast agree).
//   * the reverse directions are exact.
// Dtype codes must match kernels/_dtypes.py.
#pragma once

#define HC_F32 0
#define HC_F16 1
#define HC_BF16 2
#define HC_E4M3 3

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define HC_HD __host__ __device__ __forceinline__
#else
#define HC_HD static inline
#endif

typedef long long hc_i64;
typedef unsigned long long hc_u64;

HC_HD unsigned int hc_bits(float f) {
  union { float f; unsigned int u; } c;
  c.f = f;
  return c.u;
}

HC_HD float hc_float(unsigned int u) {
  union { float f; unsigned int u; } c;
  c.u = u;
  return c.f;
}

// Round-to-nearest-even of (m >> shift) for shift in [1, 31].
HC_HD unsigned int hc_rne_shift(unsigned int m, unsigned int shift) {
  if (shift >= 32) return 0;
  unsigned int r = m >> shift;
  unsigned int rem = m & ((1u << shift) - 1u);
  unsigned int half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u))) r += 1u;
  return r;
}

HC_HD unsigned short hc_f32_to_bf16(float f) {
  unsigned int u = hc_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // canonical NaN, as torch
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}

HC_HD float hc_bf16_to_f32(unsigned short h) { return hc_float(((unsigned int)h) << 16); }

HC_HD unsigned short hc_f32_to_f16(float f) {
  unsigned int x = hc_bits(f);
  unsigned int sign = (x >> 16) & 0x8000u;
  unsigned int ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);  // NaN
  if (ax >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // rounds to inf
  if (ax < 0x38800000u) {                                          // half subnormal
    unsigned int e = ax >> 23;
    if (e < 102u) return (unsigned short)sign;  // below half the smallest subnormal
    unsigned int m = (ax & 0x7fffffu) | 0x800000u;
    return (unsigned short)(sign | hc_rne_shift(m, 126u - e));
  }
  unsigned int r = ax - 0x38000000u;  // rebias exponent 127 -> 15
  return (unsigned short)(sign | hc_rne_shift(r, 13u));
}

HC_HD float hc_f16_to_f32(unsigned short h) {
  unsigned int sign = ((unsigned int)(h & 0x8000u)) << 16;
  unsigned int e = (h >> 10) & 0x1fu;
  unsigned int m = h & 0x3ffu;
  if (e == 0u) {
    float v = (float)m * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return hc_float(hc_bits(v) | sign);
  }
  if (e == 31u) return hc_float(sign | 0x7f800000u | (m << 13));
  return hc_float(sign | ((e + 112u) << 23) | (m << 13));
}

HC_HD unsigned char hc_f32_to_e4m3(float f) {
  unsigned int x = hc_bits(f);
  unsigned int sign = (x >> 24) & 0x80u;
  unsigned int ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (unsigned char)(sign | 0x7fu);  // NaN
  if (ax >= 0x43e00000u) return (unsigned char)(sign | 0x7eu);  // >= 448: saturate
  if (ax < 0x3c800000u) {                                         // below 2^-6: subnormal
    unsigned int e = ax >> 23;
    if (e < 116u) return (unsigned char)sign;  // below half the smallest subnormal
    unsigned int m = (ax & 0x7fffffu) | 0x800000u;
    return (unsigned char)(sign | hc_rne_shift(m, 141u - e));
  }
  unsigned int r = hc_rne_shift(ax - 0x3c000000u, 20u);  // rebias exponent 127 -> 7
  if (r > 0x7eu) r = 0x7eu;
  return (unsigned char)(sign | r);
}

HC_HD float hc_e4m3_to_f32(unsigned char b) {
  unsigned int sign = ((unsigned int)(b & 0x80u)) << 24;
  unsigned int e = (b >> 3) & 0xfu;
  unsigned int m = b & 0x7u;
  if (e == 15u && m == 7u) return hc_float(sign | 0x7fc00000u);
  if (e == 0u) {
    float v = (float)m * 0.001953125f;  // m * 2^-9, exact
    return hc_float(hc_bits(v) | sign);
  }
  return hc_float(sign | ((e + 120u) << 23) | (m << 20));
}

HC_HD float hc_load(const void* p, hc_i64 i, int code) {
  switch (code) {
    case HC_F16: return hc_f16_to_f32(((const unsigned short*)p)[i]);
    case HC_BF16: return hc_bf16_to_f32(((const unsigned short*)p)[i]);
    case HC_E4M3: return hc_e4m3_to_f32(((const unsigned char*)p)[i]);
    default: return ((const float*)p)[i];
  }
}

HC_HD void hc_store(void* p, hc_i64 i, int code, float v) {
  switch (code) {
    case HC_F16: ((unsigned short*)p)[i] = hc_f32_to_f16(v); break;
    case HC_BF16: ((unsigned short*)p)[i] = hc_f32_to_bf16(v); break;
    case HC_E4M3: ((unsigned char*)p)[i] = hc_f32_to_e4m3(v); break;
    default: ((float*)p)[i] = v; break;
  }
}
