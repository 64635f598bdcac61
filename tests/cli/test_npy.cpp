// The .npy reader and writer: round trips over every dtype and header version, Fortran order,
// and every malformed-file case naming the file.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <iterator>
#include <numeric>
#include <stdexcept>

#include "cli_test_util.h"
#include "errors.h"
#include "npy.h"

namespace evoattn::cli::test {
namespace {

std::string read_all(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

std::vector<double> sample_values(size_t n) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = (i % 3 == 0) ? 0.0 : 0.3 * static_cast<double>(i) - 2.5;
  return v;
}

class NpyRoundTrip : public ::testing::TestWithParam<std::tuple<NpyDType, int>> {};

TEST_P(NpyRoundTrip, WriteThenReadGivesTheSameArray) {
  const auto [dtype, version] = GetParam();
  TempDir dir;
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{5}, {2, 3, 4}, {1, 2, 1, 3, 2}}) {
    const size_t count = static_cast<size_t>(
        std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>()));
    const NpyArray written = make_npy(dtype, shape, sample_values(count));
    write_npy((dir / "a.npy").string(), written, version);
    const NpyArray read = read_npy((dir / "a.npy").string());
    EXPECT_EQ(read.dtype, dtype);
    EXPECT_EQ(read.shape, shape);
    EXPECT_FALSE(read.fortran_order);
    EXPECT_EQ(read.data, written.data);
    EXPECT_EQ(read.values(), written.values());
  }
}

INSTANTIATE_TEST_SUITE_P(EveryDtypeAndVersion, NpyRoundTrip,
                         ::testing::Combine(::testing::Values(NpyDType::kFloat16,
                                                              NpyDType::kFloat32,
                                                              NpyDType::kFloat64, NpyDType::kBool),
                                            ::testing::Values(1, 2, 3)));

TEST(Npy, ValuesAreRoundedToTheDtype) {
  const NpyArray half = make_npy(NpyDType::kFloat16, {3}, {1.0 / 3.0, 65504.0, 1e6});
  EXPECT_EQ(half.values(), (std::vector<double>{0.333251953125, 65504.0, INFINITY}));
  const NpyArray mask = make_npy(NpyDType::kBool, {3}, {0.0, -2.0, 1.0});
  EXPECT_EQ(mask.values(), (std::vector<double>{0.0, 1.0, 1.0}));
}

TEST(Npy, HeaderIsWhatNumPyWrites) {
  TempDir dir;
  write_npy((dir / "a.npy").string(), make_npy(NpyDType::kFloat32, {2, 3}, sample_values(6)));
  write_npy((dir / "b.npy").string(), make_npy(NpyDType::kBool, {7}, sample_values(7)), 2);
  const std::string a = read_all(dir / "a.npy"), b = read_all(dir / "b.npy");
  EXPECT_EQ(a.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(a.substr(10, 59), "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }");
  EXPECT_EQ(b.substr(0, 8), std::string("\x93NUMPY\x02\x00", 8));
  EXPECT_EQ(b.substr(12, 57), "{'descr': '|b1', 'fortran_order': False, 'shape': (7,), }");
  // The data starts 64-byte aligned, right after the header's closing newline.
  for (const auto& [file, data_bytes] : {std::pair{a, size_t{24}}, std::pair{b, size_t{7}}}) {
    const size_t data_start = file.size() - data_bytes;
    EXPECT_EQ(data_start % 64, 0u);
    EXPECT_EQ(file[data_start - 1], '\n');
  }
}

TEST(Npy, FortranOrderIsReadThroughItsStrides) {
  TempDir dir;
  NpyArray matrix = make_npy(NpyDType::kFloat64, {2, 3}, {0, 1, 2, 3, 4, 5});  // file order
  matrix.fortran_order = true;
  write_npy((dir / "f.npy").string(), matrix);
  const NpyArray read = read_npy((dir / "f.npy").string());
  EXPECT_TRUE(read.fortran_order);
  // Column-major: element (i, j) is file element i + 2 j.
  EXPECT_EQ(read.values(), (std::vector<double>{0, 2, 4, 1, 3, 5}));

  NpyArray cube = make_npy(NpyDType::kFloat32, {2, 3, 4}, sample_values(24));
  const std::vector<double> file_order = cube.values();
  cube.fortran_order = true;
  const std::vector<double> row_major = cube.values();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k)
        EXPECT_EQ(row_major[(i * 3 + j) * 4 + k], file_order[i + 2 * j + 6 * k]);
}

TEST(Npy, ReadsLooseButValidHeaders) {
  TempDir dir;
  float values[2] = {1.5f, -2.0f};
  const std::string data(reinterpret_cast<const char*>(values), sizeof values);
  write_bytes(dir / "a.npy",
              npy_file_bytes(R"({"shape":(2L,),"descr":"<f4","fortran_order":True})", data));
  const NpyArray a = read_npy((dir / "a.npy").string());
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(a.values(), (std::vector<double>{1.5, -2.0}));

  write_bytes(dir / "b.npy",
              npy_file_bytes("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }",
                             std::string("\x00\x01\x07", 3)));
  const NpyArray b = read_npy((dir / "b.npy").string());
  EXPECT_EQ(b.dtype, NpyDType::kBool);
  EXPECT_EQ(b.values(), (std::vector<double>{0, 1, 1}));
}

TEST(Npy, AnEmptyArrayHasNoValuesWhateverItsOtherDimensions) {
  // Products of the other dimensions (2^100 here) overflow 64 bits: never computed.
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{0, int64_t{1} << 50, int64_t{1} << 50},
        std::vector<int64_t>{int64_t{1} << 50, int64_t{1} << 50, 0}}) {
    NpyArray a;
    a.shape = shape;
    EXPECT_EQ(a.numel(), 0);
    EXPECT_TRUE(a.values().empty());
    a.fortran_order = true;
    EXPECT_TRUE(a.values().empty());
  }
  NpyArray huge;
  huge.shape = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_THROW(huge.numel(), std::invalid_argument);
}

TEST(Npy, OnlyRegularFilesAreOpened) {
  TempDir dir;
  fs::create_directory(dir / "d.npy");
  try {
    read_npy((dir / "d.npy").string());
    ADD_FAILURE() << "a directory was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("d.npy: not a regular file"), std::string::npos) << e.what();
  }
}

TEST(Npy, ParseNpyReadsTheSameBytesAsReadNpy) {
  TempDir dir;
  NpyArray written = make_npy(NpyDType::kFloat16, {2, 3}, sample_values(6));
  written.fortran_order = true;
  write_npy((dir / "a.npy").string(), written, 2);
  const NpyArray from_file = read_npy((dir / "a.npy").string());
  const NpyArray from_bytes = parse_npy(read_all(dir / "a.npy"), "in-memory");
  EXPECT_EQ(from_bytes.dtype, from_file.dtype);
  EXPECT_EQ(from_bytes.shape, from_file.shape);
  EXPECT_EQ(from_bytes.fortran_order, from_file.fortran_order);
  EXPECT_EQ(from_bytes.data, from_file.data);
  try {
    parse_npy("\x93NUMPY", "in-memory");
    ADD_FAILURE() << "a truncated file was parsed";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("in-memory: "), std::string::npos) << e.what();
  }
}

struct Malformed {
  const char* name;
  std::string bytes;
  const char* message;  // part of the expected error
};

std::string header(const std::string& descr, const std::string& shape) {
  return "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
}

TEST(Npy, MalformedFilesRaiseAClearErrorNamingTheFile) {
  const std::string four_floats(16, '\0');
  const std::string good = npy_file_bytes(header("<f4", "(4,)"), four_floats);
  std::string bad_version = good;
  bad_version[6] = 4;
  const std::vector<Malformed> cases = {
      {"empty", "", "wrong magic"},
      {"magic", "\x93NUMPX" + good.substr(6), "wrong magic"},
      {"version", bad_version, "format version 4.0"},
      {"short_header", good.substr(0, 9), "truncated .npy header"},
      {"cut_header", good.substr(0, 40), "truncated .npy header"},
      {"not_a_dict", npy_file_bytes("['descr', '<f4']", four_floats), "malformed"},
      {"missing_key", npy_file_bytes("{'descr': '<f4', 'shape': (4,)}", four_floats),
       "'fortran_order' is missing"},
      {"unknown_key",
       npy_file_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'x': 1}",
                      four_floats),
       "unexpected key 'x'"},
      {"duplicate_key",
       npy_file_bytes("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (4,)}",
                      four_floats),
       "appears twice"},
      {"bad_bool",
       npy_file_bytes("{'descr': '<f4', 'fortran_order': maybe, 'shape': (4,)}", four_floats),
       "True or False"},
      {"bad_shape", npy_file_bytes(header("<f4", "(2, x)"), four_floats), "non-negative integer"},
      {"negative_shape", npy_file_bytes(header("<f4", "(-4,)"), four_floats),
       "non-negative integer"},
      {"unterminated", npy_file_bytes("{'descr': '<f4, 'fortran_order': False", four_floats),
       "malformed"},
      {"trailing_text", npy_file_bytes(header("<f4", "(4,)") + " x", four_floats),
       "after the dictionary"},
      {"scalar", npy_file_bytes(header("<f4", "()"), std::string(4, '\0')), "0-d"},
      {"big_endian", npy_file_bytes(header(">f4", "(4,)"), four_floats), "big-endian"},
      {"int32", npy_file_bytes(header("<i4", "(4,)"), four_floats), "unsupported dtype '<i4'"},
      {"uint8", npy_file_bytes(header("|u1", "(16,)"), four_floats), "unsupported dtype '|u1'"},
      {"complex", npy_file_bytes(header("<c8", "(2,)"), four_floats), "unsupported dtype"},
      {"truncated_data", npy_file_bytes(header("<f4", "(5,)"), four_floats), "truncated data"},
      {"trailing_data", npy_file_bytes(header("<f4", "(3,)"), four_floats), "unexpected bytes"},
      {"huge_shape",
       npy_file_bytes(header("<f4", "(1125899906842624, 1125899906842624)"), four_floats),
       "too large"},
  };
  TempDir dir;
  for (const Malformed& c : cases) {
    const fs::path path = dir / (std::string(c.name) + ".npy");
    write_bytes(path, c.bytes);
    try {
      read_npy(path.string());
      ADD_FAILURE() << c.name << ": no error";
    } catch (const InputError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(path.string()), std::string::npos) << c.name << ": " << message;
      EXPECT_NE(message.find(c.message), std::string::npos) << c.name << ": " << message;
    }
  }
  EXPECT_THROW(read_npy((dir / "absent.npy").string()), InputError);
}

}  // namespace
}  // namespace evoattn::cli::test
