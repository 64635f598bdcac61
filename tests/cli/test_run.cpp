// `evoattn run` end to end, in-process: random .npy inputs of valid shapes (odd lengths,
// D 8 and 24, every bias and mask form, with and without do.npy), outputs against the
// float64 reference within the contract's bounds.
#include <gtest/gtest.h>

#include <cmath>

#include "run_inputs.h"

namespace evoattn::cli::test {
namespace {

struct RunCase {
  const char* name;
  RunInputs inputs;
  std::vector<std::string> flags;
  evoattn_dtype_t dtype;  // what the flags (or q.npy's dtype) make the compute dtype
  double scale = 0.0;     // 0: 1/sqrt(D)
};

std::vector<RunCase> run_cases() {
  RunInputs tiny{1, 1, 1, 1, 1, 8};
  RunInputs fp32_all{1, 2, 17, 33, 2, 24};
  fp32_all.mask_bias = {1, 2, 1, 1, 33};
  fp32_all.pair_bias = {1, 1, 2, 17, 33};
  fp32_all.mask = true;
  fp32_all.d_o = true;
  RunInputs fp16_mask{2, 3, 33, 17, 1, 8, NpyDType::kFloat16};
  fp16_mask.mask = true;
  fp16_mask.d_o = true;
  RunInputs bf16_from_f64{1, 2, 17, 17, 3, 24, NpyDType::kFloat64};
  bf16_from_f64.mask_bias = {1, 2, 1, 1, 17};
  bf16_from_f64.pair_bias = {1, 1, 3, 17, 17};
  bf16_from_f64.d_o = true;
  RunInputs broadcasts{2, 2, 5, 9, 2, 8};
  broadcasts.mask_bias = {1, 1, 1, 1, 9};
  broadcasts.pair_bias = {2, 2, 2, 5, 9};
  broadcasts.d_o = true;
  broadcasts.fortran_order = true;
  RunInputs one_query{1, 3, 1, 33, 2, 24};
  one_query.pair_bias = {1, 1, 2, 1, 33};
  one_query.d_o = true;
  RunInputs fp16_forward{1, 2, 17, 33, 2, 8, NpyDType::kFloat32};
  fp16_forward.mask_bias = {1, 2, 1, 1, 33};
  return {
      {"tiny", tiny, {}, EVOATTN_FLOAT32},
      {"fp32_all", fp32_all, {}, EVOATTN_FLOAT32},
      {"fp16_mask", fp16_mask, {}, EVOATTN_FLOAT16},
      {"bf16_from_f64", bf16_from_f64, {"--dtype", "bf16"}, EVOATTN_BFLOAT16},
      {"broadcasts_fortran", broadcasts, {"--threads", "1"}, EVOATTN_FLOAT32},
      {"one_query_scaled", one_query, {"--scale=0.7", "--backend", "cpu"}, EVOATTN_FLOAT32, 0.7},
      {"fp16_forward", fp16_forward, {"--dtype", "fp16"}, EVOATTN_FLOAT16},
  };
}

class Run : public ::testing::TestWithParam<RunCase> {};

TEST_P(Run, OutputsMatchTheFloat64Reference) {
  const RunCase& c = GetParam();
  TempDir in_dir, out_parent;
  std::mt19937_64 rng(std::hash<std::string>{}(c.name));
  write_run_inputs(in_dir.path(), c.inputs, rng);
  const std::vector<std::string> input_files = entries(in_dir.path());

  const fs::path out_dir = out_parent / "out";  // created by the run
  std::vector<std::string> words = {"run", in_dir.path().string(), "--out", out_dir.string()};
  words.insert(words.end(), c.flags.begin(), c.flags.end());
  const CliResult result = run_cli(words);
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_NE(result.out.find("wrote o.npy lse.npy"), std::string::npos) << result.out;
  EXPECT_EQ(entries(in_dir.path()), input_files);

  std::vector<std::string> want = {"lse.npy", "o.npy"};
  if (c.inputs.d_o) {
    want.insert(want.end(), {"dk.npy", "dq.npy", "dv.npy"});
    if (!c.inputs.mask_bias.empty()) want.push_back("dmask_bias.npy");
    if (!c.inputs.pair_bias.empty()) want.push_back("dpair_bias.npy");
  }
  std::sort(want.begin(), want.end());
  EXPECT_EQ(entries(out_dir), want);

  const double scale = c.scale != 0.0 ? c.scale : 1.0 / std::sqrt(double(c.inputs.D));
  EXPECT_EQ(check_run_outputs(in_dir.path(), out_dir, c.dtype, scale), "");
}

INSTANTIATE_TEST_SUITE_P(Shapes, Run, ::testing::ValuesIn(run_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Run, WritesNextToTheInputsByDefault) {
  TempDir dir;
  std::mt19937_64 rng(7);
  RunInputs in{1, 2, 3, 4, 1, 8};
  in.d_o = true;
  write_run_inputs(dir.path(), in, rng);
  const CliResult result = run_cli({"run", dir.path().string()});
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_EQ(entries(dir.path()),
            (std::vector<std::string>{"dk.npy", "do.npy", "dq.npy", "dv.npy", "k.npy", "lse.npy",
                                      "o.npy", "q.npy", "v.npy"}));
  EXPECT_EQ(check_run_outputs(dir.path(), dir.path(), EVOATTN_FLOAT32, 1.0 / std::sqrt(8.0)), "");
  // A second run in place reads the same inputs and warns about none of its own outputs.
  const CliResult again = run_cli({"run", dir.path().string()});
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(again.err, "");
}

TEST(Run, WarnsAboutEveryNpyFileItDoesNotRead) {
  TempDir dir;
  std::mt19937_64 rng(9);
  RunInputs in{1, 2, 3, 4, 1, 8};
  in.mask_bias = {1, 2, 1, 1, 4};
  write_run_inputs(dir.path(), in, rng);
  fs::rename(dir / "mask_bias.npy", dir / "mask_bais.npy");  // a typo: its mask is not applied
  write_bytes(dir / "notes.txt", "not an array");
  const CliResult result = run_cli({"run", dir.path().string()});
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_EQ(result.err, "evoattn run: warning: " + (dir / "mask_bais.npy").string() +
                            " is not an input and is not read (the inputs: q, k, v, mask_bias, "
                            "pair_bias, mask, do)\n");
  EXPECT_EQ(check_run_outputs(dir.path(), dir.path(), EVOATTN_FLOAT32, 1.0 / std::sqrt(8.0)), "");
}

}  // namespace
}  // namespace evoattn::cli::test
