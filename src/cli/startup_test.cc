// What the trybox binary loads when it starts. Every command pays for each shared library
// the CLI needs, before main: on the development host `trybox --version` took 27 ms with
// libcurl and its 25 dependencies (pulled in through the daemon's services), 14 ms without,
// 7 ms without libcrypto and libarchive (docs/performance.md, "The CLI's start"). The
// daemon's services, and what only a rare command needs, stay out of the CLI.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "cli/testing.h"
#include "util/sanitizer.h"

namespace trybox::cli {
namespace {

// The shared objects the dynamic loader maps for `bin`, as it lists them itself
// (LD_TRACE_LOADED_OBJECTS: what ldd does, without running the program).
std::string LoadedObjects(const std::string& bin) {
  std::string cmd = "LD_TRACE_LOADED_OBJECTS=1 '" + bin + "'";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return "";
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  ::pclose(p);
  return out;
}

TEST(CliStartupTest, TheCliLoadsNoneOfTheDaemonsLibraries) {
  auto bin = testing::TryboxBinary();
  ASSERT_TRUE(bin.ok()) << bin.status().ToString();
  const std::string loaded = LoadedObjects(*bin);
  // The listing itself is real: the C library is always there.
  ASSERT_NE(loaded.find("libc.so"), std::string::npos) << loaded;
  // libcrypto and libarchive (with libxml2 and ICU) took another 6 ms: hashing is Nettle's,
  // and trees and base images are made by programs of their own (trybox-tar,
  // trybox-image-build).
  for (const char* lib :
       {"libcurl", "libsqlite3", "libmicrohttpd", "libext2fs", "libnghttp2", "libssl.so",
        "libseccomp", "libcrypto", "libarchive", "libxml2", "libicu"}) {
    EXPECT_EQ(loaded.find(lib), std::string::npos) << lib << " is loaded by the CLI:\n" << loaded;
  }
}

// Without the sanitizers the C++ runtime is linked into the CLI (CMakeLists.txt): resolving
// libstdc++'s symbols took 1.4 ms of every command's start.
TEST(CliStartupTest, TheCliCarriesItsCxxRuntime) {
#ifdef TRYBOX_ASAN
  GTEST_SKIP() << "a sanitized build loads libstdc++ for the sanitizer's interceptors";
#else
  auto bin = testing::TryboxBinary();
  ASSERT_TRUE(bin.ok()) << bin.status().ToString();
  const std::string loaded = LoadedObjects(*bin);
  ASSERT_NE(loaded.find("libc.so"), std::string::npos) << loaded;
  EXPECT_EQ(loaded.find("libstdc++"), std::string::npos) << loaded;
#endif
}

}  // namespace
}  // namespace trybox::cli
