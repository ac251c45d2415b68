// Anchor packing: move hidden-state rows between a [tokens, hidden] tensor and a
// compact [n, hidden] buffer, optionally changing dtype (float32/float16/bfloat16)
// or quantising to float8 e4m3 with one float32 scale per row.
//
// Launch contract (see kernels/anchors.py): one thread block per row with a
// grid-stride loop over rows; pointers are raw device addresses; an index pointer of
// 0 means "row r maps to row r". Strides are in bytes for the byte copies and in
// elements for the converting kernels. The host checks alignment before choosing a
// vector width, and forbids repeated destination rows. Dtypes are template
// parameters so the per-element conversion is resolved at compile time.
#include "dtype_convert.cuh"

template <typename V>
__device__ __forceinline__ void hc_rows_copy(hc_u64 src, hc_i64 src_stride, hc_u64 src_idx,
                                             hc_u64 dst, hc_i64 dst_stride, hc_u64 dst_idx,
                                             hc_i64 n_rows, hc_i64 row_bytes) {
  const hc_i64* sidx = reinterpret_cast<const hc_i64*>(src_idx);
  const hc_i64* didx = reinterpret_cast<const hc_i64*>(dst_idx);
  const hc_i64 vecs = row_bytes / (hc_i64)sizeof(V);
  for (hc_i64 r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const hc_i64 s = sidx ? sidx[r] : r;
    const hc_i64 d = didx ? didx[r] : r;
    const V* from = reinterpret_cast<const V*>(src + s * src_stride);
    V* to = reinterpret_cast<V*>(dst + d * dst_stride);
    for (hc_i64 v = threadIdx.x; v < vecs; v += blockDim.x) to[v] = from[v];
  }
}

#define HC_COPY_KERNEL(NAME, V)                                                            \
  extern "C" __global__ void NAME(hc_u64 src, hc_i64 src_stride, hc_u64 src_idx,            \
                                  hc_u64 dst, hc_i64 dst_stride, hc_u64 dst_idx,            \
                                  hc_i64 n_rows, hc_i64 row_bytes) {                        \
    hc_rows_copy<V>(src, src_stride, src_idx, dst, dst_stride, dst_idx, n_rows, row_bytes); \
  }

HC_COPY_KERNEL(hc_rows_copy_v16, uint4)
HC_COPY_KERNEL(hc_rows_copy_v4, unsigned int)
HC_COPY_KERNEL(hc_rows_copy_v1, unsigned char)

// dst[didx[r], :] = convert(src[sidx[r], :] (* scale[r] when scale != 0)).
template <int SRC, int DST>
__device__ __forceinline__ void hc_rows_convert(hc_u64 src, hc_i64 src_stride, hc_u64 src_idx,
                                                hc_u64 dst, hc_i64 dst_stride, hc_u64 dst_idx,
                                                hc_u64 scale, hc_i64 n_rows, hc_i64 row_elems) {
  const hc_i64* sidx = reinterpret_cast<const hc_i64*>(src_idx);
  const hc_i64* didx = reinterpret_cast<const hc_i64*>(dst_idx);
  const float* scl = reinterpret_cast<const float*>(scale);
  for (hc_i64 r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const hc_i64 s = (sidx ? sidx[r] : r) * src_stride;
    const hc_i64 d = (didx ? didx[r] : r) * dst_stride;
    const float k = scl ? scl[r] : 1.0f;
    for (hc_i64 e = threadIdx.x; e < row_elems; e += blockDim.x) {
      float v = hc_load(reinterpret_cast<const void*>(src), s + e, SRC);
      if (scl) v = v * k;
      hc_store(reinterpret_cast<void*>(dst), d + e, DST, v);
    }
  }
}

#define HC_CONVERT_KERNEL(NAME, SRC, DST)                                                    \
  extern "C" __global__ void NAME(hc_u64 src, hc_i64 src_stride, hc_u64 src_idx, hc_u64 dst, \
                                  hc_i64 dst_stride, hc_u64 dst_idx, hc_u64 scale,            \
                                  hc_i64 n_rows, hc_i64 row_elems) {                          \
    hc_rows_convert<SRC, DST>(src, src_stride, src_idx, dst, dst_stride, dst_idx, scale,      \
                              n_rows, row_elems);                                             \
  }

// names: hc_rows_convert_<src code>_<dst code>, codes as in dtype_convert.cuh
HC_CONVERT_KERNEL(hc_rows_convert_0_1, HC_F32, HC_F16)
HC_CONVERT_KERNEL(hc_rows_convert_0_2, HC_F32, HC_BF16)
HC_CONVERT_KERNEL(hc_rows_convert_1_0, HC_F16, HC_F32)
HC_CONVERT_KERNEL(hc_rows_convert_1_2, HC_F16, HC_BF16)
HC_CONVERT_KERNEL(hc_rows_convert_2_0, HC_BF16, HC_F32)
HC_CONVERT_KERNEL(hc_rows_convert_2_1, HC_BF16, HC_F16)
HC_CONVERT_KERNEL(hc_rows_convert_3_0, HC_E4M3, HC_F32)
HC_CONVERT_KERNEL(hc_rows_convert_3_1, HC_E4M3, HC_F16)
HC_CONVERT_KERNEL(hc_rows_convert_3_2, HC_E4M3, HC_BF16)

// float -> e4m3 (round to nearest even, saturating). hw != 0 uses the sm_89+ hardware
// conversion; the host verifies once per device that it matches the integer version.
__device__ __forceinline__ unsigned char hc_e4m3(float v, hc_i64 hw) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if (hw) {
    unsigned short pair;
    // the first source operand lands in the upper byte, the second in the lower one
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(v));
    return (unsigned char)(pair & 0xffu);
  }
#endif
  return hc_f32_to_e4m3(v);
}

// Quantise gathered rows to e4m3: scale[r] = amax(|row|) / 448 (1 for an all-zero
// row), q = e4m3(clamp(x * (1 / scale), -448, 448)). dst is a dense [n_rows, row_elems]
// byte buffer. Needs blockDim.x a power of two <= 1024.
template <int SRC>
__device__ __forceinline__ void hc_rows_quant(hc_u64 src, hc_i64 src_stride, hc_u64 src_idx,
                                              hc_u64 dst, hc_u64 scale, hc_i64 n_rows,
                                              hc_i64 row_elems, hc_i64 hw) {
  __shared__ float red[1024];
  const hc_i64* sidx = reinterpret_cast<const hc_i64*>(src_idx);
  unsigned char* out = reinterpret_cast<unsigned char*>(dst);
  float* scl = reinterpret_cast<float*>(scale);
  for (hc_i64 r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const hc_i64 s = (sidx ? sidx[r] : r) * src_stride;
    float amax = 0.0f;
    for (hc_i64 e = threadIdx.x; e < row_elems; e += blockDim.x) {
      amax = fmaxf(amax, fabsf(hc_load(reinterpret_cast<const void*>(src), s + e, SRC)));
    }
    red[threadIdx.x] = amax;
    __syncthreads();
    for (unsigned int w = blockDim.x / 2; w > 0; w >>= 1) {
      if (threadIdx.x < w) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + w]);
      __syncthreads();
    }
    const float row_max = red[0];
    const float k = row_max > 0.0f ? row_max / 448.0f : 1.0f;
    const float inv = 1.0f / k;
    if (threadIdx.x == 0) scl[r] = k;
    for (hc_i64 e = threadIdx.x; e < row_elems; e += blockDim.x) {
      float v = hc_load(reinterpret_cast<const void*>(src), s + e, SRC) * inv;
      v = fminf(fmaxf(v, -448.0f), 448.0f);
      out[r * row_elems + e] = hc_e4m3(v, hw);
    }
    __syncthreads();  // red[] is reused by the next row
  }
}

#define HC_QUANT_KERNEL(NAME, SRC)                                                          \
  extern "C" __global__ void NAME(hc_u64 src, hc_i64 src_stride, hc_u64 src_idx, hc_u64 dst, \
                                  hc_u64 scale, hc_i64 n_rows, hc_i64 row_elems, hc_i64 hw) { \
    hc_rows_quant<SRC>(src, src_stride, src_idx, dst, scale, n_rows, row_elems, hw);          \
  }

HC_QUANT_KERNEL(hc_rows_quant_e4m3_0, HC_F32)
HC_QUANT_KERNEL(hc_rows_quant_e4m3_1, HC_F16)
HC_QUANT_KERNEL(hc_rows_quant_e4m3_2, HC_BF16)
