// The informational entry points: version, status strings, option defaults.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "evoattn/evoattn.h"

namespace {

TEST(ApiInfo, Version) {
  EXPECT_EQ(evoattn_version(),
            EVOATTN_VERSION_MAJOR * 10000 + EVOATTN_VERSION_MINOR * 100 + EVOATTN_VERSION_PATCH);
  EXPECT_EQ(std::string(evoattn_version_string()), std::to_string(EVOATTN_VERSION_MAJOR) + "." +
                                                       std::to_string(EVOATTN_VERSION_MINOR) + "." +
                                                       std::to_string(EVOATTN_VERSION_PATCH));
}

TEST(ApiInfo, StatusStrings) {
  const evoattn_status_t all[] = {EVOATTN_SUCCESS,
                                  EVOATTN_ERROR_INVALID_ARGUMENT,
                                  EVOATTN_ERROR_UNSUPPORTED,
                                  EVOATTN_ERROR_WORKSPACE_TOO_SMALL,
                                  EVOATTN_ERROR_BACKEND_UNAVAILABLE,
                                  EVOATTN_ERROR_CUDA,
                                  EVOATTN_ERROR_INTERNAL};
  for (evoattn_status_t s : all) {
    ASSERT_NE(evoattn_status_string(s), nullptr);
    EXPECT_STRNE(evoattn_status_string(s), "unknown status") << s;
  }
  EXPECT_STREQ(evoattn_status_string(EVOATTN_SUCCESS), "success");
}

// A C caller may pass any int; the library reads it as one (under UBSan, a switch on the C++
// enum reported this load of 99 as undefined).
TEST(ApiInfo, StatusStringOfAnUnknownCodeIsUnknownStatus) {
  EXPECT_STREQ(evoattn_status_string(static_cast<evoattn_status_t>(99)), "unknown status");
  EXPECT_STREQ(evoattn_status_string(static_cast<evoattn_status_t>(-1)), "unknown status");
}

TEST(ApiInfo, OptionsDefaults) {
  evoattn_options_t options;
  options.abi_version = 0;
  options.has_scale = 7;
  options.deterministic = 0;
  options.allow_tf32 = 1;
  options.num_threads = 5;
  evoattn_options_init(&options);
  EXPECT_EQ(options.abi_version, static_cast<uint32_t>(EVOATTN_ABI_VERSION));
  EXPECT_EQ(options.has_scale, 0);
  EXPECT_EQ(options.deterministic, 1);
  EXPECT_EQ(options.allow_tf32, 0);
  EXPECT_EQ(options.num_threads, 0);
  evoattn_options_init(nullptr);  // must not crash
}

}  // namespace
