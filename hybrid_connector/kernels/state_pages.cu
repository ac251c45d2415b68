// Copy whole recurrent-state pages between slots, for many state tensors at once.
//
// table is a device array of n_tensors rows of 5 int64:
//   (src base address, dst base address, src slot stride, dst slot stride, page bytes)
// and page p of tensor t goes from src_base + src_slots[p] * src_stride to
// dst_base + dst_slots[p] * dst_stride. Each page is cut into chunk_bytes pieces so a
// few large pages (a 2 MiB SSM state) still spread over every SM: work item
// k = (t * n_pairs + p) * chunks + c, one thread block per item, grid-stride loop.
// The host picks the vector width only when every address, stride, page size and
// chunk size is a multiple of it, and rejects launches whose destination pages
// overlap a source page or each other.
#include "dtype_convert.cuh"

template <typename V>
__device__ __forceinline__ void hc_copy_pages(hc_u64 table, hc_i64 n_tensors, hc_u64 src_slots,
                                              hc_u64 dst_slots, hc_i64 n_pairs, hc_i64 chunks,
                                              hc_i64 chunk_bytes) {
  const hc_i64* tab = reinterpret_cast<const hc_i64*>(table);
  const hc_i64* ss = reinterpret_cast<const hc_i64*>(src_slots);
  const hc_i64* ds = reinterpret_cast<const hc_i64*>(dst_slots);
  const hc_i64 items = n_tensors * n_pairs * chunks;
  for (hc_i64 k = blockIdx.x; k < items; k += gridDim.x) {
    const hc_i64 c = k % chunks;
    const hc_i64 p = (k / chunks) % n_pairs;
    const hc_i64* row = tab + 5 * (k / (chunks * n_pairs));
    const hc_i64 off = c * chunk_bytes;
    const hc_i64 page = row[4];
    if (off >= page) continue;
    const hc_i64 n = (page - off < chunk_bytes ? page - off : chunk_bytes) / (hc_i64)sizeof(V);
    const V* from = reinterpret_cast<const V*>(row[0] + ss[p] * row[2] + off);
    V* to = reinterpret_cast<V*>(row[1] + ds[p] * row[3] + off);
    for (hc_i64 v = threadIdx.x; v < n; v += blockDim.x) to[v] = from[v];
  }
}

#define HC_PAGES_KERNEL(NAME, V)                                                            \
  extern "C" __global__ void NAME(hc_u64 table, hc_i64 n_tensors, hc_u64 src_slots,          \
                                  hc_u64 dst_slots, hc_i64 n_pairs, hc_i64 chunks,           \
                                  hc_i64 chunk_bytes) {                                      \
    hc_copy_pages<V>(table, n_tensors, src_slots, dst_slots, n_pairs, chunks, chunk_bytes);  \
  }

HC_PAGES_KERNEL(hc_copy_pages_v16, uint4)
HC_PAGES_KERNEL(hc_copy_pages_v4, unsigned int)
HC_PAGES_KERNEL(hc_copy_pages_v1, unsigned char)
