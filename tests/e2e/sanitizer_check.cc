// e2e_tests fails when a daemon it ran reported a sanitizer's finding in its log (an e2e run
// from a sanitized build; scripts/test.sh runs the e2e suites from the plain one). The daemon's
// stderr is its log, which no test reads, and a leak found as it stops changes nothing a test sees;
// the harness keeps each report as it cleans up (Harness::CleanUp), and this environment turns them
// into a failure of the program.
#include <gtest/gtest.h>

#include "tests/e2e/harness.h"

namespace trybox::e2e {
namespace {

class SanitizerCheck : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const std::string& report : Harness::SanitizerReports()) {
      ADD_FAILURE() << "a sanitizer reported in " << report;
    }
  }
};

// Registered before main (gtest_main) runs the tests; gtest owns and deletes it.
[[maybe_unused]] ::testing::Environment* const kSanitizerCheck =
    ::testing::AddGlobalTestEnvironment(new SanitizerCheck);

}  // namespace
}  // namespace trybox::e2e
