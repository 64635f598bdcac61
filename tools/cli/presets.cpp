#include "presets.h"

namespace evoattn::cli {

std::string ProblemShape::dims() const {
  const std::string lengths =
      Lq == Lk ? "L" + std::to_string(Lq) : "Lq" + std::to_string(Lq) + " Lk" + std::to_string(Lk);
  return "B" + std::to_string(B) + " N" + std::to_string(N) + " " + lengths + " H" +
         std::to_string(H) + " D" + std::to_string(D);
}

std::string ProblemShape::biases() const {
  if (mask_bias && pair_bias) return "mask+pair";
  if (mask_bias) return "mask";
  return pair_bias ? "pair" : "none";
}

const std::vector<ProblemShape>& suite_presets() {
  static const std::vector<ProblemShape> presets = {
      {"tri256", 1, 256, 256, 256, 4, 32, true, true},
      {"tri768", 1, 768, 768, 768, 4, 32, true, true},
      {"msarow", 1, 512, 256, 256, 8, 32, true, true},
      {"msacol", 1, 256, 512, 512, 8, 32, true, false},
      {"extramsa", 1, 5120, 384, 384, 8, 8, true, true},
      {"template", 4, 256, 256, 256, 4, 16, true, true},
      {"apb768", 1, 1, 768, 768, 16, 24, false, true},
      {"tri256d64", 1, 256, 256, 256, 8, 64, true, true},
      {"b4tri384", 4, 384, 384, 384, 4, 32, true, true},
  };
  return presets;
}

const ProblemShape& small_preset() {
  static const ProblemShape small{"small", 1, 8, 64, 64, 4, 32, true, true};
  return small;
}

std::optional<ProblemShape> find_preset(const std::string& name) {
  if (name == small_preset().name) return small_preset();
  for (const ProblemShape& p : suite_presets()) {
    if (p.name == name) return p;
  }
  return std::nullopt;
}

std::string preset_names() {
  std::string names = small_preset().name;
  for (const ProblemShape& p : suite_presets()) names += ", " + p.name;
  return names;
}

}  // namespace evoattn::cli
