// Anchor packing: move hidden-state rows between a [tokens, hidden] tensor and a
// compact [n, hidden] buffer, optionally changing dtype (float32/float16/bfloat16)
// or quantising to float8 e4m3 with one float32 scale per row.
//
// Launch contract (see kernels/anchors.py): one thread block per row with a
// grid-stride loop over rows; pointers are raw device addresses; an index pointer of
// 0 means "row r maps to row r". Strides are in bytes for the byte copies and in
// elements for the converting kernels. The host checks alignment before choosing a
// vector width, and forbids repeated destination rows.
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

extern "C" __global__ void hc_rows_copy_v16(hc_u64 src, hc_i64 src_stride, hc_u64 src_idx,
                                            hc_u64 dst, hc_i64 dst_stride, hc_u64 dst_idx,
                                            hc_i64 n_rows, hc_i64 row_bytes) {
  hc_rows_copy<uint4>(src, src_stride, src_idx, dst, dst_stride, dst_idx, n_rows, row_bytes);
}

extern "C" __global__ void hc_rows_copy_v4(hc_u64 src, hc_i64 src_stride, hc_u64 src_idx,
                                           hc_u64 dst, hc_i64 dst_stride, hc_u64 dst_idx,
                                           hc_i64 n_rows, hc_i64 row_bytes) {
  hc_rows_copy<unsigned int>(src, src_stride, src_idx, dst, dst_stride, dst_idx, n_rows,
                             row_bytes);
}

extern "C" __global__ void hc_rows_copy_v1(hc_u64 src, hc_i64 src_stride, hc_u64 src_idx,
                                           hc_u64 dst, hc_i64 dst_stride, hc_u64 dst_idx,
                                           hc_i64 n_rows, hc_i64 row_bytes) {
  hc_rows_copy<unsigned char>(src, src_stride, src_idx, dst, dst_stride, dst_idx, n_rows,
                              row_bytes);
}

// dst[didx[r], :] = convert(src[sidx[r], :] (* scale[r] when scale != 0)).
extern "C" __global__ void hc_rows_convert(hc_u64 src, hc_i64 src_stride, hc_u64 src_idx,
                                           hc_i64 src_code, hc_u64 dst, hc_i64 dst_stride,
                                           hc_u64 dst_idx, hc_i64 dst_code, hc_u64 scale,
                                           hc_i64 n_rows, hc_i64 row_elems) {
  const hc_i64* sidx = reinterpret_cast<const hc_i64*>(src_idx);
  const hc_i64* didx = reinterpret_cast<const hc_i64*>(dst_idx);
  const float* scl = reinterpret_cast<const float*>(scale);
  for (hc_i64 r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const hc_i64 s = (sidx ? sidx[r] : r) * src_stride;
    const hc_i64 d = (didx ? didx[r] : r) * dst_stride;
    const float k = scl ? scl[r] : 1.0f;
    for (hc_i64 e = threadIdx.x; e < row_elems; e += blockDim.x) {
      float v = hc_load(reinterpret_cast<const void*>(src), s + e, (int)src_code);
      if (scl) v = v * k;
      hc_store(reinterpret_cast<void*>(dst), d + e, (int)dst_code, v);
    }
  }
}

// Quantise gathered rows to e4m3: scale[r] = amax(|row|) / 448 (1 for an all-zero
// row), q = e4m3(clamp(x / scale, -448, 448)). dst is a dense [n_rows, row_elems]
// byte buffer. Needs blockDim.x a power of two <= 1024.
extern "C" __global__ void hc_rows_quant_e4m3(hc_u64 src, hc_i64 src_stride, hc_u64 src_idx,
                                              hc_i64 src_code, hc_u64 dst, hc_u64 scale,
                                              hc_i64 n_rows, hc_i64 row_elems) {
  __shared__ float red[1024];
  const hc_i64* sidx = reinterpret_cast<const hc_i64*>(src_idx);
  unsigned char* out = reinterpret_cast<unsigned char*>(dst);
  float* scl = reinterpret_cast<float*>(scale);
  for (hc_i64 r = blockIdx.x; r < n_rows; r += gridDim.x) {
    const hc_i64 s = (sidx ? sidx[r] : r) * src_stride;
    float amax = 0.0f;
    for (hc_i64 e = threadIdx.x; e < row_elems; e += blockDim.x) {
      amax = fmaxf(amax, fabsf(hc_load(reinterpret_cast<const void*>(src), s + e, (int)src_code)));
    }
    red[threadIdx.x] = amax;
    __syncthreads();
    for (unsigned int w = blockDim.x / 2; w > 0; w >>= 1) {
      if (threadIdx.x < w) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + w]);
      __syncthreads();
    }
    const float row_max = red[0];
    const float k = row_max > 0.0f ? row_max / 448.0f : 1.0f;
    if (threadIdx.x == 0) scl[r] = k;
    for (hc_i64 e = threadIdx.x; e < row_elems; e += blockDim.x) {
      float v = hc_load(reinterpret_cast<const void*>(src), s + e, (int)src_code) / k;
      v = fminf(fmaxf(v, -448.0f), 448.0f);
      out[r * row_elems + e] = hc_f32_to_e4m3(v);
    }
    __syncthreads();  // red[] is reused by the next row
  }
}
