// Every bad-input path of `evoattn run`: exit code 2, one clear message, no output written.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <functional>
#include <iterator>

#include "evoattn/evoattn.h"
#include "run_inputs.h"

namespace evoattn::cli::test {
namespace {

struct BadCase {
  const char* name;
  std::function<void(const fs::path& in_dir)> spoil;  // applied to valid inputs
  std::vector<std::string> flags;
  const char* message;  // part of the expected message
};

void save_f32(const fs::path& path, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  write_npy(path.string(), make_npy(NpyDType::kFloat32, shape, std::vector<double>(n, 0.5)));
}

std::vector<BadCase> bad_cases() {
  // The valid inputs: B1 N2 Lq5 Lk6 H2 D8 with every optional file.
  return {
      {"missing_q", [](const fs::path& d) { fs::remove(d / "q.npy"); }, {}, "q.npy: missing"},
      {"missing_v", [](const fs::path& d) { fs::remove(d / "v.npy"); }, {}, "v.npy: missing"},
      {"unreadable_q",
       [](const fs::path& d) { write_bytes(d / "q.npy", "not numpy"); },
       {},
       "wrong magic"},
      {"truncated_k",
       [](const fs::path& d) {
         write_bytes(
             d / "k.npy",
             npy_file_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 6, 2, 8), }",
                            "abc"));
       },
       {},
       "truncated data"},
      {"big_endian_v",
       [](const fs::path& d) {
         write_bytes(
             d / "v.npy",
             npy_file_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", "abcd"));
       },
       {},
       "big-endian"},
      {"k_shape_mismatch",
       [](const fs::path& d) {
         save_f32(d / "k.npy", {1, 2, 6, 3, 8});
       },
       {},
       "argument 'k'"},
      {"q_not_5d",
       [](const fs::path& d) {
         save_f32(d / "q.npy", {2, 5, 8});
       },
       {},
       "5 dimensions"},
      {"q_6d",
       [](const fs::path& d) {
         save_f32(d / "q.npy", {1, 1, 2, 5, 2, 8});
       },
       {},
       "at most 5 dimensions"},
      {"empty_q",
       [](const fs::path& d) {
         save_f32(d / "q.npy", {1, 2, 0, 2, 8});
       },
       {},
       "empty"},
      {"bool_q",
       [](const fs::path& d) {
         write_npy((d / "q.npy").string(),
                   make_npy(NpyDType::kBool, {1, 2, 5, 2, 8}, std::vector<double>(160, 1)));
       },
       {},
       "expected float16, float32 or float64"},
      {"float_mask",
       [](const fs::path& d) {
         save_f32(d / "mask.npy", {1, 2, 6});
       },
       {},
       "expected bool"},
      {"uint8_mask",
       [](const fs::path& d) {
         write_bytes(d / "mask.npy", npy_file_bytes("{'descr': '|u1', 'fortran_order': False, "
                                                    "'shape': (1, 2, 6), }",
                                                    std::string(12, '\x01')));
       },
       {},
       "mask.npy: unsupported dtype '|u1'"},
      {"dangling_mask_link",
       [](const fs::path& d) {
         fs::remove(d / "mask.npy");
         fs::create_symlink(d / "gone", d / "mask.npy");
       },
       {},
       "mask.npy: a symbolic link to nothing"},
      {"dangling_do_link",
       [](const fs::path& d) {
         fs::remove(d / "do.npy");
         fs::create_symlink(d / "gone", d / "do.npy");
       },
       {},
       "do.npy: a symbolic link to nothing"},
      {"directory_as_q",
       [](const fs::path& d) {
         fs::remove(d / "q.npy");
         fs::create_directory(d / "q.npy");
       },
       {},
       "q.npy: not a regular file"},
      {"fifo_as_k",  // opening it would block forever
       [](const fs::path& d) {
         fs::remove(d / "k.npy");
         ASSERT_EQ(mkfifo((d / "k.npy").c_str(), 0600), 0);
       },
       {},
       "k.npy: not a regular file"},
      {"mask_wrong_length",
       [](const fs::path& d) {
         write_npy((d / "mask.npy").string(),
                   make_npy(NpyDType::kBool, {1, 2, 5}, std::vector<double>(10, 1)));
       },
       {},
       "argument 'mask'"},
      {"pair_bias_no_broadcast",
       [](const fs::path& d) {
         save_f32(d / "pair_bias.npy", {1, 1, 2, 4, 6});
       },
       {},
       "does not broadcast"},
      {"mask_bias_4d",
       [](const fs::path& d) {
         save_f32(d / "mask_bias.npy", {1, 2, 1, 6});
       },
       {},
       "argument 'mask_bias'"},
      {"do_wrong_shape",
       [](const fs::path& d) {
         save_f32(d / "do.npy", {1, 2, 6, 2, 8});
       },
       {},
       "argument 'd_o'"},
      {"head_dim_129",
       [](const fs::path& d) {
         save_f32(d / "q.npy", {1, 2, 5, 2, 129});
         save_f32(d / "k.npy", {1, 2, 6, 2, 129});
         save_f32(d / "v.npy", {1, 2, 6, 2, 129});
         save_f32(d / "do.npy", {1, 2, 5, 2, 129});
       },
       {},
       "D <= 128"},
      {"bad_dtype_flag", nullptr, {"--dtype", "fp64"}, "--dtype: expected one of fp16, bf16, fp32"},
      {"bad_backend_flag", nullptr, {"--backend", "gpu"}, "--backend"},
      {"zero_threads", nullptr, {"--threads", "0"}, "--threads"},
      {"bad_scale", nullptr, {"--scale", "abc"}, "--scale: expected a number"},
      {"nan_scale", nullptr, {"--scale", "nan"}, "options.scale"},
      {"unknown_flag", nullptr, {"--fast"}, "unknown flag --fast"},
      {"flag_without_value", nullptr, {"--threads"}, "--threads needs a value"},
      {"two_directories", nullptr, {"elsewhere"}, "expected one input directory"},
  };
}

class RunBadInput : public ::testing::TestWithParam<BadCase> {};

TEST_P(RunBadInput, ExitsWithCode2AMessageAndNoOutput) {
  const BadCase& c = GetParam();
  TempDir in_dir, out_parent;
  RunInputs valid{1, 2, 5, 6, 2, 8};
  valid.mask_bias = {1, 2, 1, 1, 6};
  valid.pair_bias = {1, 1, 2, 5, 6};
  valid.mask = true;
  valid.d_o = true;
  std::mt19937_64 rng(3);
  write_run_inputs(in_dir.path(), valid, rng);
  if (c.spoil) c.spoil(in_dir.path());
  const std::vector<std::string> inputs = entries(in_dir.path());

  const fs::path out_dir = out_parent / "out";
  std::vector<std::string> words = {"run", in_dir.path().string(), "--out", out_dir.string()};
  words.insert(words.end(), c.flags.begin(), c.flags.end());
  const CliResult result = run_cli(words);
  EXPECT_EQ(result.code, 2) << result.err;
  EXPECT_EQ(result.err.rfind("evoattn run: ", 0), 0u) << result.err;
  EXPECT_NE(result.err.find(c.message), std::string::npos) << result.err;
  EXPECT_EQ(result.out, "");
  EXPECT_EQ(entries(in_dir.path()), inputs) << "the input directory gained files";
  EXPECT_FALSE(fs::exists(out_dir)) << "the output directory was created";
}

INSTANTIATE_TEST_SUITE_P(Cases, RunBadInput, ::testing::ValuesIn(bad_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(RunBadInput, DirectoryProblems) {
  TempDir dir;
  CliResult r = run_cli({"run", (dir / "absent").string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("not a directory"), std::string::npos) << r.err;

  std::mt19937_64 rng(5);
  write_run_inputs(dir.path(), RunInputs{1, 1, 2, 2, 1, 8}, rng);
  write_bytes(dir / "file", "x");
  r = run_cli({"run", dir.path().string(), "--out", (dir / "file").string()});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("exists and is not a directory"), std::string::npos) << r.err;

  r = run_cli({"run"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("usage: evoattn run DIR"), std::string::npos) << r.err;
  EXPECT_EQ(entries(dir.path()), (std::vector<std::string>{"file", "k.npy", "q.npy", "v.npy"}));
}

TEST(RunBadInput, CudaWithoutCudaIsABadFlag) {
  if (evoattn_cuda_available()) GTEST_SKIP() << "a CUDA device is available";
  TempDir dir;
  std::mt19937_64 rng(5);
  write_run_inputs(dir.path(), RunInputs{1, 1, 2, 2, 1, 8}, rng);
  const CliResult r = run_cli({"run", dir.path().string(), "--backend", "cuda"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("no CUDA"), std::string::npos) << r.err;
  EXPECT_EQ(entries(dir.path()), (std::vector<std::string>{"k.npy", "q.npy", "v.npy"}));
}

TEST(RunFailure, AFailedWriteExitsWith1AndLeavesNoTemporaries) {
  TempDir dir;
  std::mt19937_64 rng(5);
  write_run_inputs(dir.path(), RunInputs{1, 1, 2, 2, 1, 8}, rng);
  fs::create_directory(dir / "o.npy");  // the final rename onto it fails
  const CliResult r = run_cli({"run", dir.path().string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("evoattn run: error: "), std::string::npos) << r.err;
  EXPECT_EQ(entries(dir.path()), (std::vector<std::string>{"k.npy", "o.npy", "q.npy", "v.npy"}));
}

TEST(RunFailure, ALaterOutputFailingLeavesEveryEarlierOneAsItWas) {
  TempDir dir;
  std::mt19937_64 rng(6);
  RunInputs in{1, 1, 2, 2, 1, 8};
  in.d_o = true;
  write_run_inputs(dir.path(), in, rng);
  write_bytes(dir / "o.npy", "an earlier run's o");  // replaced only if every output lands
  fs::create_directory(dir / "dq.npy");               // dq.npy cannot be written
  const CliResult r = run_cli({"run", dir.path().string()});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("dq.npy: exists and is not a regular file"), std::string::npos) << r.err;
  EXPECT_EQ(entries(dir.path()), (std::vector<std::string>{"do.npy", "dq.npy", "k.npy", "o.npy",
                                                           "q.npy", "v.npy"}));
  std::ifstream o(dir / "o.npy", std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(o), {}), "an earlier run's o");
}

TEST(RunFailure, OutputsReplaceEarlierOnesWhenEveryOneLands) {
  TempDir dir;
  std::mt19937_64 rng(8);
  write_run_inputs(dir.path(), RunInputs{1, 1, 2, 2, 1, 8}, rng);
  write_bytes(dir / "o.npy", "an earlier run's o");
  const CliResult r = run_cli({"run", dir.path().string()});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(entries(dir.path()), (std::vector<std::string>{"k.npy", "lse.npy", "o.npy", "q.npy",
                                                           "v.npy"}));
  EXPECT_EQ(read_npy((dir / "o.npy").string()).shape, (std::vector<int64_t>{1, 1, 2, 1, 8}));
}

}  // namespace
}  // namespace evoattn::cli::test
