// Problem shapes: the docs/CONTRACT.md benchmark suite, plus `small`, the quick default.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace evoattn::cli {

struct ProblemShape {
  std::string name;
  int64_t B, N, Lq, Lk, H, D;
  bool mask_bias;  // [B, N, 1, 1, Lk]
  bool pair_bias;  // [B, 1, H, Lq, Lk]

  int64_t scores() const { return B * N * H * Lq * Lk; }  // E in the contract's FLOP counts
  std::string dims() const;    // "B1 N256 L256 H4 D32" ("Lq.. Lk.." when they differ)
  std::string biases() const;  // "mask+pair", "mask", "pair" or "none"
};

// In docs/CONTRACT.md's order.
const std::vector<ProblemShape>& suite_presets();
// B1 N8 L64 H4 D32 with both biases: a few seconds on two CPU cores.
const ProblemShape& small_preset();
// A suite preset or "small".
std::optional<ProblemShape> find_preset(const std::string& name);
std::string preset_names();  // comma-separated, for usage messages

}  // namespace evoattn::cli
