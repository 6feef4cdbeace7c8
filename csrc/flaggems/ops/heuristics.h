#pragma once

// FlagGems 5.0.2's launch heuristics for NVIDIA (runtime/backend/_nvidia/
// heuristics_config_utils.py, utils/shape_utils.py, utils/pointwise_dynamic.py),
// as pure functions of sizes: what the planners compute tiles, grids and warps
// with. No torch dependency (tests/cpp/test_triton_abi.cpp checks them).

#include <algorithm>
#include <cstdint>

namespace torch_fl::flaggems::heur {

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// triton.next_power_of_2 (0 -> 0, 1 -> 1, 5 -> 8).
inline int64_t next_pow2(int64_t n) {
  uint64_t v = static_cast<uint64_t>(n) - 1;
  for (int s = 1; s < 64; s <<= 1) v |= v >> s;
  return static_cast<int64_t>(v + 1);
}

// default_heuristics_for_num_warps, softmax_heur_num_warps_*: by tile size.
inline int warps_by_tile(int64_t tile) { return tile < 2048 ? 4 : tile < 4096 ? 8 : 16; }

// shape_utils.heuristics_for_tile_size: from the last dimension, each tile the
// next power of two of its size within what is left of the budget.
inline void tile_sizes(int64_t budget, const int64_t* shape, int ndim, int64_t* tiles) {
  for (int i = ndim - 1; i >= 0; --i) {
    tiles[i] = std::min<int64_t>(budget, next_pow2(shape[i]));
    budget = std::max<int64_t>(1, budget / tiles[i]);
  }
}

// softmax_heur_tile_n_inner (also mean's and argmax's inner kernels).
inline int64_t tile_n_inner(int64_t n) { return n <= 32 * 1024 ? next_pow2(n) : 4096; }

// The "waves" loop several heuristics share: double the tile while the grid
// over-fills the GPU and the bound allows.
inline int64_t grow_tile_k(int64_t tile_k, int64_t upper, int64_t M, int64_t K, int sms) {
  while (tile_k <= upper) {
    const double waves = static_cast<double>(M * cdiv(K, tile_k)) / sms;
    if (waves > 1 && tile_k * 2 <= upper) {
      tile_k *= 2;
    } else {
      break;
    }
  }
  return tile_k;
}

// softmax_heur_tile_k.
inline int64_t softmax_tile_k(int64_t M, int64_t K, int sms) {
  return grow_tile_k(1, std::min<int64_t>(K, 8192), M, K, sms);
}

// mean_heur_tile_k.
inline int64_t mean_tile_k(int64_t M, int64_t K, int sms) {
  const int64_t upper = std::min<int64_t>(std::min<int64_t>(K, 512), std::max<int64_t>(1, 4096 / 64));
  int64_t tile_k = grow_tile_k(1, upper, M, K, sms);
  const int64_t min_tile_k = cdiv(K, 65535);  // grid Y limit
  if (min_tile_k > tile_k) tile_k = next_pow2(min_tile_k);
  return tile_k;
}

// mean_heur_tile_n_non_inner.
inline int64_t mean_tile_n(int64_t N, int64_t tile_k) {
  const int64_t limit = std::max<int64_t>(1, 4096 / tile_k);
  int64_t desired = std::min(std::max<int64_t>(N, 64), limit);
  desired = std::min({desired, int64_t{2048}, limit});
  int64_t tile_n = next_pow2(desired);
  if (tile_n > limit) tile_n = limit;
  return std::max<int64_t>(tile_n, 64);
}

// argmax_heur_tile_k.
inline int64_t argmax_tile_k(int64_t M, int64_t K, bool fp32, int sms) {
  if (M == 64 && K == 512) return fp32 ? 64 : 128;
  if (K <= 128) {
    if (K <= 0) return 1;
    int bits = 0;
    for (int64_t k = K; k; k >>= 1) ++bits;
    return int64_t{1} << (bits - 1);
  }
  return grow_tile_k(64, std::min<int64_t>(K, 512), M, K, sms);
}

// argmax_heur_tile_n_non_inner (not a power of two for n <= 128: FlagGems'
// kernel then fails to compile, so the planner declines).
inline int64_t argmax_tile_n(int64_t n, int64_t tile_k) {
  if (n <= 128) return n;
  int64_t tile_n = next_pow2(std::min<int64_t>(8192, n));
  tile_n = std::max<int64_t>(64, std::min<int64_t>(tile_n, 4096));
  if (tile_n * tile_k > 32768) tile_n = std::max<int64_t>(64, 32768 / tile_k);
  return tile_n;
}

// argmax_heur_num_warps_non_inner.
inline int argmax_warps(int64_t tile_n, bool fp32) {
  int w = tile_n <= 32 ? 2 : tile_n <= 128 ? 4 : 8;
  return fp32 ? std::min(w, 4) : w;
}

// index_select_heur_block_m / _block_n.
inline int64_t index_select_block_m(int64_t N) { return std::min<int64_t>(4, next_pow2(cdiv(256, N))); }
inline int64_t index_select_block_n(int64_t N) {
  return std::max<int64_t>(std::min<int64_t>(next_pow2(cdiv(N, 16)), 512), 16);
}

}  // namespace torch_fl::flaggems::heur
