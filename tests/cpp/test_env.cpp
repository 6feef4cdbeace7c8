// Strict parsing of the HAL's environment variables.

#include <cstdlib>

#include <gtest/gtest.h>

#include "hal/driver.h"
#include "hal/env.h"

using torch_fl::hal::ConfigError;
using torch_fl::hal::env_byte_size;
using torch_fl::hal::env_int;
using torch_fl::hal::parse_byte_size;

namespace {

struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* value) : name(n) {
    if (value) setenv(n, value, 1); else unsetenv(n);
  }
  ~ScopedEnv() { unsetenv(name); }
};

std::string error_of(const char* name, long lo, long hi) {
  try {
    env_int(name, 1, lo, hi);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ParseByteSize, AcceptsUnitsAndPlainNumbers) {
  EXPECT_EQ(parse_byte_size("1048576"), 1048576u);
  EXPECT_EQ(parse_byte_size("64KiB"), 64u * 1024);
  EXPECT_EQ(parse_byte_size("2GiB"), 2ull << 30);
  EXPECT_EQ(parse_byte_size("2G"), 2ull << 30);
  EXPECT_EQ(parse_byte_size("2gib"), 2ull << 30);
  EXPECT_EQ(parse_byte_size("1.5GB"), 1500000000u);
  EXPECT_EQ(parse_byte_size("512 MiB"), 512ull << 20);
  EXPECT_EQ(parse_byte_size("3B"), 3u);
}

TEST(ParseByteSize, RejectsGarbageZeroAndNegative) {
  for (const char* bad : {"", "abc", "-1", "0", "0GiB", "1.2.3", "12XB",
                          "GiB", "1e9", "99999999999999999999999TiB", " 5"}) {
    EXPECT_FALSE(parse_byte_size(bad).has_value()) << "accepted '" << bad << "'";
  }
}

TEST(EnvInt, UnsetGivesDefault) {
  ScopedEnv e("FLAGOS_TEST_INT", nullptr);
  EXPECT_EQ(env_int("FLAGOS_TEST_INT", 7, 1, 10), 7);
}

TEST(EnvInt, ValidValueIsRead) {
  ScopedEnv e("FLAGOS_TEST_INT", "4");
  EXPECT_EQ(env_int("FLAGOS_TEST_INT", 1, 1, 10), 4);
}

TEST(EnvInt, BadValuesNameVariableValueAndRange) {
  for (const char* bad : {"", "x", "0", "11", "-3", "2.5", "4 ", " 4",
                          "99999999999999999999999"}) {
    ScopedEnv e("FLAGOS_TEST_INT", bad);
    std::string msg = error_of("FLAGOS_TEST_INT", 1, 10);
    ASSERT_FALSE(msg.empty()) << "accepted '" << bad << "'";
    EXPECT_NE(msg.find("FLAGOS_TEST_INT"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("from 1 to 10"), std::string::npos) << msg;
  }
}

TEST(EnvByteSize, BadValueNamesVariableAndExamples) {
  ScopedEnv e("FLAGOS_TEST_SIZE", "lots");
  try {
    env_byte_size("FLAGOS_TEST_SIZE");
    FAIL() << "accepted 'lots'";
  } catch (const ConfigError& err) {
    std::string msg = err.what();
    EXPECT_NE(msg.find("FLAGOS_TEST_SIZE='lots'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("2GiB"), std::string::npos) << msg;
  }
}

TEST(DriverSelection, UnknownAcceleratorListsChoices) {
  ScopedEnv e("FLAGOS_ACCELERATOR", "tpu");
  try {
    torch_fl::hal::driver();
    FAIL() << "accepted FLAGOS_ACCELERATOR=tpu";
  } catch (const ConfigError& err) {
    std::string msg = err.what();
    EXPECT_NE(msg.find("'tpu'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("auto"), std::string::npos) << msg;
    EXPECT_NE(msg.find("host"), std::string::npos) << msg;
  }
}
