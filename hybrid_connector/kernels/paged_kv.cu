// Paged KV blocks <-> contiguous chunk buffer, one attention layer per launch.
//
// The cache is addressed through byte strides for its logical dims (kv, block, token,
// head); the head_size dim must be dense. That covers vLLM's FlashAttention layout
// [2, num_blocks, block_size, num_kv_heads, head_size], FlashInfer's
// [num_blocks, 2, block_size, num_kv_heads, head_size] and their HND physical
// permutations with one kernel. The buffer is always dense
// [2, n_blocks, block_size, num_kv_heads, head_size]. One thread block per
// (kv, block, token) group with a grid-stride loop; threads stride over the
// num_kv_heads * head_size row of that token. scatter != 0 writes the cache.
#include "dtype_convert.cuh"

template <typename V>
__device__ __forceinline__ void hc_kv_blocks(hc_u64 cache, hc_i64 s_kv, hc_i64 s_blk,
                                             hc_i64 s_tok, hc_i64 s_head, hc_u64 buf,
                                             hc_u64 block_ids, hc_i64 n_blocks,
                                             hc_i64 block_size, hc_i64 n_heads,
                                             hc_i64 head_bytes, hc_i64 scatter) {
  const hc_i64* ids = reinterpret_cast<const hc_i64*>(block_ids);
  const int vecs_per_head = (int)(head_bytes / (hc_i64)sizeof(V));
  const int vecs_per_token = vecs_per_head * (int)n_heads;
  const hc_i64 groups = 2 * n_blocks * block_size;
  for (hc_i64 g = blockIdx.x; g < groups; g += gridDim.x) {
    const hc_i64 t = g % block_size;
    const hc_i64 i = (g / block_size) % n_blocks;
    const hc_i64 kv = g / (block_size * n_blocks);
    char* c = reinterpret_cast<char*>(cache) + kv * s_kv + ids[i] * s_blk + t * s_tok;
    char* b = reinterpret_cast<char*>(buf) + g * (hc_i64)vecs_per_token * (hc_i64)sizeof(V);
    for (int j = threadIdx.x; j < vecs_per_token; j += blockDim.x) {
      const int h = j / vecs_per_head;
      const int v = j - h * vecs_per_head;
      V* cp = reinterpret_cast<V*>(c + h * s_head) + v;
      V* bp = reinterpret_cast<V*>(b) + j;
      if (scatter) {
        *cp = *bp;
      } else {
        *bp = *cp;
      }
    }
  }
}

#define HC_KV_KERNEL(NAME, V)                                                              \
  extern "C" __global__ void NAME(hc_u64 cache, hc_i64 s_kv, hc_i64 s_blk, hc_i64 s_tok,    \
                                  hc_i64 s_head, hc_u64 buf, hc_u64 block_ids,              \
                                  hc_i64 n_blocks, hc_i64 block_size, hc_i64 n_heads,       \
                                  hc_i64 head_bytes, hc_i64 scatter) {                      \
    hc_kv_blocks<V>(cache, s_kv, s_blk, s_tok, s_head, buf, block_ids, n_blocks,            \
                    block_size, n_heads, head_bytes, scatter);                              \
  }

HC_KV_KERNEL(hc_kv_blocks_v16, uint4)
HC_KV_KERNEL(hc_kv_blocks_v4, unsigned int)
HC_KV_KERNEL(hc_kv_blocks_v1, unsigned char)
