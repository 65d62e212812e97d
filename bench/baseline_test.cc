#include "bench/baseline.h"

#include <gtest/gtest.h>

#include "util/fd.h"

namespace trybox::bench {
namespace {

class BaselineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = TempDir::Make(::testing::TempDir(), "baseline_test");
    ASSERT_TRUE(d.ok());
    dir_.emplace(std::move(*d));
  }
  std::string Path(const std::string& name) const { return dir_->path() + "/" + name; }
  std::optional<TempDir> dir_;
};

TEST_F(BaselineTest, WorseIsMeasuredTheWayEachFigureIsBetter) {
  Figure latency{"rt", 30, "ms", true, "round trip"};
  Figure rate{"mbs", 40, "MB/s", false, "stream"};
  EXPECT_DOUBLE_EQ(WorseBy(latency, 10), 3.0);
  EXPECT_DOUBLE_EQ(WorseBy(rate, 80), 2.0);
  EXPECT_DOUBLE_EQ(WorseBy(rate, 20), 0.5);
  EXPECT_EQ(WorseBy(latency, 0), 0);  // nothing to compare with
}

TEST_F(BaselineTest, OnlyFiguresPastTheFactorAreMarked) {
  FiguresFile f(Path("a.json"));
  f.Lower("exec.rt", 16, "ms", "exec round trip");  // 1.6x worse than 10
  f.Higher("stream", 50, "MB/s", "stdout");         // 1.2x worse than 60
  f.Lower("new.one", 5, "ms", "a figure the baseline lacks");
  ASSERT_TRUE(f.Write().ok());
  auto now = ReadFigures({Path("a.json")});
  ASSERT_TRUE(now.ok()) << now.status().ToString();
  ASSERT_EQ(now->size(), 3u);
  Baseline base;
  base.figures["exec.rt"] = {"exec.rt", 10, "ms", true, ""};
  base.figures["stream"] = {"stream", 60, "MB/s", false, ""};
  int worse = -1;
  std::string table = CompareTable(*now, base, &worse);
  EXPECT_EQ(worse, 1);
  size_t line = table.find("exec round trip");
  ASSERT_NE(line, std::string::npos);
  EXPECT_NE(table.substr(line, table.find('\n', line) - line).find("WORSE"), std::string::npos);
  line = table.find("stdout");
  EXPECT_EQ(table.substr(line, table.find('\n', line) - line).find("WORSE"), std::string::npos);
}

// The machine's speed comes from a peer in the same guest: qemu-guest-agent's round trip,
// recorded, or derived from an older baseline's ratio and trybox's round trip. A peer's
// figure is shown but never marked.
TEST_F(BaselineTest, APeersFigureGivesTheMachinesFactorAndIsNeverMarked) {
  std::vector<Figure> now = {{"exec.rt", 40, "ms", true, "exec round trip"},
                             {kQgaRoundTrip, 52, "ms", true, "peer: qga"}};
  Baseline older;  // before the peer figure existed
  older.figures["exec.qga_ratio"] = {"exec.qga_ratio", 0.8, "x", false, ""};
  older.figures["exec.round_trip_p50_ms"] = {"exec.round_trip_p50_ms", 16.25, "ms", true, ""};
  auto m = MachineFactor(now, older);
  ASSERT_TRUE(m.has_value());
  EXPECT_DOUBLE_EQ(*m, 4.0);  // 52 / (0.8 x 16.25)

  Baseline base;
  base.figures["exec.rt"] = {"exec.rt", 10, "ms", true, ""};
  base.figures[kQgaRoundTrip] = {kQgaRoundTrip, 13, "ms", true, ""};
  int worse = -1;
  std::string table = CompareTable(now, base, &worse);
  EXPECT_EQ(worse, 1);  // exec.rt (4x); the peer's 4x is not trybox's
  EXPECT_NE(table.find("runs guests 4.00x slower"), std::string::npos) << table;
  EXPECT_FALSE(MachineFactor({{"exec.rt", 40, "ms", true, ""}}, base).has_value());
  EXPECT_FALSE(MachineFactor(now, Baseline{}).has_value());
}

TEST_F(BaselineTest, RecordNeedsAReasonAndKeepsItWithTheFigures) {
  std::vector<Figure> now = {{"exec.rt", 9.5, "ms", true, "exec round trip"}};
  EXPECT_EQ(Record(Path("b.json"), now, "", "1 1 1", "2026-12-01").code(), Code::kInvalidArgument);
  EXPECT_FALSE(ReadFileToString(Path("b.json")).ok());  // nothing written
  ASSERT_TRUE(Record(Path("b.json"), now, "exec tick removed", "3.1 2 1", "2026-12-01").ok());
  auto b = ReadBaseline(Path("b.json"));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->reason, "exec tick removed");
  EXPECT_EQ(b->recorded, "2026-12-01");
  EXPECT_EQ(b->load, "3.1 2 1");
  ASSERT_EQ(b->figures.count("exec.rt"), 1u);
  EXPECT_DOUBLE_EQ(b->figures["exec.rt"].value, 9.5);
  EXPECT_TRUE(b->figures["exec.rt"].lower_is_better);
}

TEST_F(BaselineTest, MissingBaselineIsEmptyAndAMalformedFiguresFileIsAnError) {
  auto b = ReadBaseline(Path("none.json"));
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b->figures.empty());
  ASSERT_TRUE(WriteFileAtomic(Path("bad.json"), "[1,2]").ok());
  EXPECT_FALSE(ReadFigures({Path("bad.json")}).ok());
}

}  // namespace
}  // namespace trybox::bench
