// Token histograms. Build: one thread per (row, position), atomic increments into the
// zeroed counts. Update: one thread per new (request, token) pair, so the cost depends on
// the number of new tokens only, never on the history length.
#pragma once
#include "cuda/device_utils.cuh"

namespace specops {

inline LaunchConfig bincount_config(const BincountParams& p) {
  LaunchConfig cfg;
  if (p.rows <= 0 || p.max_len <= 0 || p.vocab <= 0) return cfg;
  cfg.block = static_cast<int>(std::min<int64_t>(kBlock, ceil_div(p.max_len, 32) * 32));
  cfg.grid_x = ceil_div(p.max_len, cfg.block);
  cfg.grid_y = p.rows < kMaxGridY ? p.rows : kMaxGridY;
  return cfg;
}

SPECOPS_HD void bincount_thread(const BincountParams& p, const Coord& c) {
  const int64_t j = c.bx * c.bdim + c.tx;
  if (j >= p.max_len) return;
  for (int64_t r = c.by; r < p.rows; r += c.gy) {
    const int64_t t = load_index(p.token_ids, p.ids_int64, r * p.ids_stride + j);
    if (t >= 0 && t < p.vocab) atomic_increment(p.counts + r * p.vocab + t);
  }
}

inline LaunchConfig bincount_update_config(const BincountUpdateParams& p) {
  LaunchConfig cfg;
  if (p.n <= 0 || p.rows <= 0 || p.vocab <= 0) return cfg;
  cfg.grid_x = ceil_div(p.n, cfg.block);
  cfg.grid_y = 1;
  return cfg;
}

SPECOPS_HD void bincount_update_thread(const BincountUpdateParams& p, const Coord& c) {
  const int64_t i = c.bx * c.bdim + c.tx;
  if (i >= p.n) return;
  const int64_t r = load_index(p.req_indices, p.req_int64, i);
  const int64_t t = load_index(p.token_ids, p.tok_int64, i);
  if (r >= 0 && r < p.rows && t >= 0 && t < p.vocab) atomic_increment(p.counts + r * p.counts_stride + t);
}

}  // namespace specops
