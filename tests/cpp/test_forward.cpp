// Forward against the float64 reference over the size grid: every L in {1, 2, 17, 97, 257} and
// every D in {1, 8, 16, 24, 32, 40, 64, 96, 128}, for each dtype, with B > 1 and N, H both 1 and
// > 1. The big L = 257 / D = 128 shapes keep B*N*H small: the reference is O(B N H Lq Lk D).
// Small shapes with several key tiles take the CUDA forward's split-key mode (pair_over_k);
// Lk % 8 == 0 with 16-bit biases its fast path (fwd_fast_path).
#include <gtest/gtest.h>

#include "attention_case.h"

namespace evoattn::test {
namespace {

std::vector<Case> grid() {
  std::vector<Case> cases;
  for (evoattn_dtype_t dt : {EVOATTN_FLOAT32, EVOATTN_FLOAT16, EVOATTN_BFLOAT16}) {
    cases.push_back(shape(2, 3, 2, 1, 1, 32, dt));
    cases.push_back(shape(2, 2, 3, 2, 2, 1, dt).biases("bn11k", ""));
    cases.push_back(shape(3, 2, 2, 17, 17, 8, dt).biases("", "b1hqk"));
    cases.push_back(shape(2, 1, 2, 97, 97, 16, dt).biases("bn11k", "b1hqk"));
    cases.push_back(shape(2, 1, 1, 257, 257, 24, dt).biases("bn11k", "b1hqk"));
    cases.push_back(shape(2, 2, 1, 17, 97, 40, dt).biases("bn11k", "b1hqk"));
    cases.push_back(shape(2, 1, 3, 97, 17, 64, dt).biases("bn11k", "b1hqk"));
    cases.push_back(shape(2, 1, 1, 2, 257, 96, dt).biases("bn11k", "b1hqk"));
    cases.push_back(shape(2, 2, 2, 17, 17, 128, dt).biases("bn11k", "b1hqk"));
    cases.push_back(shape(2, 1, 1, 257, 1, 128, dt).biases("bn11k", "b1hqk"));
    cases.push_back(shape(2, 1, 1, 257, 257, 128, dt).biases("bn11k", "b1hqk"));
    // Lk % 8 == 0 with biases in the input dtype: the CUDA fast path, with few items (the
    // groups split the keys) and with enough items that a block pairs them instead: over n with
    // a shared pair-bias tile, over query tiles.
    cases.push_back(shape(2, 3, 2, 80, 136, 32, dt).biases("bn11k", "b1hqk"));
    cases.push_back(shape(1, 64, 4, 130, 136, 32, dt).biases("bn11k", "b1hqk"));
    cases.push_back(shape(1, 64, 2, 70, 136, 16, dt).biases("bn11k", "b1hqk"));  // kShared, D 16
    cases.push_back(shape(1, 1, 200, 130, 96, 16, dt).biases("", "bnhqk"));
    cases.push_back(shape(1, 2, 2, 250, 136, 16, dt).biases("bn11k", "b1hqk"));  // Hopper: 4 consumers
    // Head dim 24 with each group's own fast tile (AlphaFold 3's N = 1 pair-bias attention: the
    // kernel with an m16n8k8 step and three column tiles of O), split keys and over query tiles;
    // without a mask bias and with whole key tiles its instantiation without key biases (split
    // keys: an even key-tile count; an odd one takes the other).
    cases.push_back(shape(2, 1, 2, 80, 136, 24, dt).biases("bn11k", "b1hqk"));
    cases.push_back(shape(1, 1, 200, 130, 96, 24, dt).biases("", "bnhqk"));
    cases.push_back(shape(2, 1, 2, 80, 128, 24, dt).biases("", "b1hqk"));
    cases.push_back(shape(1, 1, 200, 130, 128, 24, dt).biases("", "bnhqk"));
    cases.push_back(shape(2, 1, 2, 70, 192, 24, dt).biases("", "b1hqk"));
    // No tile bias, head dim <= 32: the fast forward compiled without tile code (FwdTile::kNone),
    // split keys, paired over n, over query tiles.
    cases.push_back(shape(2, 3, 2, 80, 136, 32, dt).biases("bn11k", ""));
    cases.push_back(shape(1, 64, 4, 130, 136, 16, dt).biases("bn11k", ""));
    cases.push_back(shape(1, 1, 200, 130, 96, 8, dt));
    // Head dim 64: few items (three groups per block on the H100 split four key tiles, the last
    // group's past Lk) and enough to pair over n (on the H100 the wide-warp kernel).
    cases.push_back(shape(2, 2, 1, 65, 200, 64, dt).biases("bn11k", "b1hqk"));
    cases.push_back(shape(1, 130, 2, 70, 136, 64, dt).biases("bn11k", "b1hqk"));
    // With more items, head dim 64 and a shared pair-bias tile take the wide-warp kernel on the
    // H100 (two groups of two warps, two blocks per SM), over query tiles, and with N odd (an
    // idle group) and one key tile.
    cases.push_back(shape(1, 64, 8, 130, 136, 64, dt).biases("bn11k", "b1hqk"));
    cases.push_back(shape(1, 65, 8, 70, 64, 64, dt).biases("bn11k", "b1hqk"));
    // The wide-warp kernel's two warp groups a block, on the H100 (132 blocks; group wg walks
    // items blockIdx.x + wg gridDim.x, + 2 gridDim.x, ...): 257 items, so the last block's
    // second group has none (it recomputes one and stores nothing); 265, so the first block's
    // first group has one more than its second (which takes empty turns at the end).
    cases.push_back(shape(1, 513, 1, 64, 72, 64, dt).biases("bn11k", "b1hqk"));
    cases.push_back(shape(1, 529, 1, 64, 72, 64, dt).biases("bn11k", "b1hqk"));
    // Blocks walking items in the kernels with four-warp groups: head dim 64 without a tile
    // bias (three groups), head dim 128 (two).
    cases.push_back(shape(1, 64, 8, 130, 136, 64, dt).biases("bn11k", ""));
    cases.push_back(shape(1, 32, 8, 70, 136, 128, dt).biases("bn11k", "b1hqk"));
  }
  // Scores rising along the keys: 0.2 per key moves the running max by ~18 (log2 units) a key
  // tile, past the CUDA forward's lazy-rescale slack every tile; 0.05 per key (~4.6 a tile)
  // stays within it for a tile and passes it every other one. Few items (the groups split the
  // keys), and (B N H q-tiles = 512, Lk % 8 == 0) enough to pair them over n on the fast path.
  for (double ramp : {0.2, 0.05}) {
    for (evoattn_dtype_t dt : {EVOATTN_FLOAT32, EVOATTN_FLOAT16, EVOATTN_BFLOAT16}) {
      for (int64_t D : {32, 64}) {
        Case rising = shape(2, 3, 2, 70, 300, D, dt).biases("bn11k", "b1hqk");
        rising.key_ramp = ramp;
        cases.push_back(rising);
      }
    }
    for (evoattn_dtype_t dt : {EVOATTN_FLOAT16, EVOATTN_BFLOAT16}) {
      Case paired = shape(1, 64, 4, 70, 136, 32, dt).biases("bn11k", "b1hqk");
      paired.key_ramp = ramp;
      cases.push_back(paired);
      Case wide = shape(1, 64, 8, 70, 136, 64, dt).biases("bn11k", "b1hqk");  // wide warps
      wide.key_ramp = ramp;
      cases.push_back(wide);
      Case mask_only = shape(2, 3, 2, 70, 304, 32, dt).biases("bn11k", "");  // FwdTile::kNone
      mask_only.key_ramp = ramp;
      cases.push_back(mask_only);
      Case own24 = shape(2, 1, 2, 70, 304, 24, dt).biases("bn11k", "b1hqk");  // kOwn, head dim 24
      own24.key_ramp = ramp;
      cases.push_back(own24);
      Case own24_no_keys = shape(2, 1, 2, 70, 256, 24, dt).biases("", "b1hqk");  // and no key biases
      own24_no_keys.key_ramp = ramp;
      cases.push_back(own24_no_keys);
    }
  }
  // A caller-given scale: in float32, and in bf16 with Lk % 8 == 0 on the CUDA fast kernels,
  // which take any scale; -0.5 and 1e-6 lie below the Hopper forward's kFwdMinScale (2^-16),
  // so on an H100 those run the portable kernels wherever the Hopper family would take the call.
  Case scaled = shape(2, 2, 2, 17, 33, 32, EVOATTN_FLOAT32).biases("bn11k", "b1hqk");
  scaled.scale = 0.37;
  cases.push_back(scaled);
  for (double scale : {0.37, -0.5, 1e5}) {
    Case scaled16 = shape(2, 2, 2, 17, 72, 32, EVOATTN_BFLOAT16).biases("bn11k", "b1hqk");
    scaled16.scale = scale;
    cases.push_back(scaled16);
  }
  // The same on the kernel compiled for a shared pair-bias tile (512 items, paired over n).
  for (double scale : {0.37, -0.5, 1e5, 1e-6}) {
    Case shared = shape(1, 64, 4, 70, 72, 32, EVOATTN_BFLOAT16).biases("bn11k", "b1hqk");
    shared.scale = scale;
    cases.push_back(shared);
  }
  return cases;
}

class Forward : public ::testing::TestWithParam<Case> {};

TEST_P(Forward, MatchesReference) {
  const Case& c = GetParam();
  if (backend_missing(c.backend)) GTEST_SKIP() << kNoCudaMessage;
  const Inputs in = make_inputs(c);
  const evoattn_options_t options = case_options(c);
  expect_forward_matches(c, in, run_forward(c, in, &options));
}

INSTANTIATE_TEST_SUITE_P(Grid, Forward, ::testing::ValuesIn(on_backends(grid(), 100)), case_name);

}  // namespace
}  // namespace evoattn::test
