// Batched byte-range copy used to move whole recurrent-state pages between slots.
//
// descs is a device array of n triples (src address, dst address, bytes), built on the
// host from slot ids, page strides and page sizes, with large pages already split into
// chunks so that many SMs share one page. One thread block per descriptor with a
// grid-stride loop. The host picks the vector width only when every address and size
// is a multiple of it, and guarantees that no destination range overlaps another
// range of the same launch.
#include "dtype_convert.cuh"

template <typename V>
__device__ __forceinline__ void hc_copy_ranges(hc_u64 descs, hc_i64 n) {
  const hc_i64* d = reinterpret_cast<const hc_i64*>(descs);
  for (hc_i64 k = blockIdx.x; k < n; k += gridDim.x) {
    const V* from = reinterpret_cast<const V*>(d[3 * k]);
    V* to = reinterpret_cast<V*>(d[3 * k + 1]);
    const hc_i64 vecs = d[3 * k + 2] / (hc_i64)sizeof(V);
    for (hc_i64 v = threadIdx.x; v < vecs; v += blockDim.x) to[v] = from[v];
  }
}

extern "C" __global__ void hc_copy_ranges_v16(hc_u64 descs, hc_i64 n) {
  hc_copy_ranges<uint4>(descs, n);
}

extern "C" __global__ void hc_copy_ranges_v1(hc_u64 descs, hc_i64 n) {
  hc_copy_ranges<unsigned char>(descs, n);
}
