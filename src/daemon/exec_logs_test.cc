// ExecLogs on real files in a temp directory: the cap keeping head and tail with the gap
// reported exactly, offsets that resume byte for byte, followers that end with the exec or
// when their client goes, and logs read back from disk after their exec ended.
#include "daemon/exec_logs.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "channel/frame.h"
#include "util/fd.h"

namespace trybox::daemon {
namespace {

// Byte i of a test output: distinct enough that any misplaced range shows.
std::string Pattern(int64_t from, int64_t n) {
  std::string s;
  for (int64_t i = from; i < from + n; ++i) s += static_cast<char>('!' + (i * 7 + i / 91) % 90);
  return s;
}

class ExecLogsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = TempDir::Make(::testing::TempDir(), "exec_logs");
    ASSERT_TRUE(d.ok());
    dir_.emplace(std::move(*d));
  }
  std::string dir() const { return dir_->path(); }

  // Reads the whole stream from `offset` as a client would: data, and gaps as [from,to).
  static std::string ReadAll(ExecLog& log, ExecLog::Channel ch, int64_t offset, size_t chunk,
                             std::vector<std::pair<int64_t, int64_t>>* gaps = nullptr) {
    std::string out;
    for (;;) {
      auto s = log.Read(ch, offset, chunk);
      EXPECT_TRUE(s.ok()) << s.status().ToString();
      if (!s.ok()) return out;
      if (s->skipped_to >= 0) {
        if (gaps) gaps->push_back({offset, s->skipped_to});
        offset = s->skipped_to;
        continue;
      }
      if (s->data.empty()) return out;
      out += s->data;
      offset += static_cast<int64_t>(s->data.size());
    }
  }

  std::optional<TempDir> dir_;
};

TEST_F(ExecLogsTest, OutputUnderTheCapIsKeptWholeAndOffsetsResumeExactly) {
  ExecLogs logs(dir(), 1024);
  auto log = logs.Start("vm1", 7);
  log->Append(channel::kChanOut, "hello ");
  log->Append(channel::kChanErr, "oops\n");
  log->Append(channel::kChanOut, "world\n");
  EXPECT_EQ(ReadAll(*log, ExecLog::kStdout, 0, 1 << 20), "hello world\n");
  EXPECT_EQ(ReadAll(*log, ExecLog::kStderr, 0, 1 << 20), "oops\n");
  // Resuming from any offset, in reads of any size, gives exactly the rest.
  for (int64_t off = 0; off <= 12; ++off) {
    EXPECT_EQ(ReadAll(*log, ExecLog::kStdout, off, 5), std::string("hello world\n").substr(off));
  }
  EXPECT_EQ(log->total(ExecLog::kStdout), 12);
  auto past = log->Read(ExecLog::kStdout, 13, 10);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), Code::kInvalidArgument);
  EXPECT_NE(past.status().message().find("12 bytes"), std::string::npos);
}

TEST_F(ExecLogsTest, TheCapKeepsTheHeadAndTheTailAndNamesTheDroppedRange) {
  ExecLogs logs(dir(), 100);  // 50 of head, 50 of tail
  auto log = logs.Start("vm1", 1);
  int64_t written = 0;
  // Chunks that straddle the head's end, wrap the ring, and exceed the ring.
  for (int64_t n : {7, 13, 45, 1, 200, 3, 49, 50, 51, 581}) {
    log->Append(channel::kChanOut, Pattern(written, n));
    written += n;
  }
  ASSERT_EQ(written, 1000);
  std::vector<std::pair<int64_t, int64_t>> gaps;
  std::string got = ReadAll(*log, ExecLog::kStdout, 0, 1 << 20, &gaps);
  EXPECT_EQ(got, Pattern(0, 50) + Pattern(950, 50));
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_EQ(gaps[0], std::make_pair(int64_t{50}, int64_t{950}));
  // An offset inside the gap resumes at the tail; one inside the tail reads from there.
  auto in_gap = log->Read(ExecLog::kStdout, 700, 10);
  ASSERT_TRUE(in_gap.ok());
  EXPECT_EQ(in_gap->skipped_to, 950);
  EXPECT_TRUE(in_gap->data.empty());
  EXPECT_EQ(ReadAll(*log, ExecLog::kStdout, 973, 4), Pattern(973, 27));
  EXPECT_EQ(ReadAll(*log, ExecLog::kStdout, 10, 3, &gaps), Pattern(10, 40) + Pattern(950, 50));
}

TEST_F(ExecLogsTest, OneChunkLargerThanTheWholeCapKeepsItsHeadAndTail) {
  ExecLogs logs(dir(), 64);
  auto log = logs.Start("vm1", 2);
  log->Append(channel::kChanErr, Pattern(0, 10000));
  std::vector<std::pair<int64_t, int64_t>> gaps;
  EXPECT_EQ(ReadAll(*log, ExecLog::kStderr, 0, 1000, &gaps), Pattern(0, 32) + Pattern(9968, 32));
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_EQ(gaps[0], std::make_pair(int64_t{32}, int64_t{9968}));
  EXPECT_EQ(log->total(ExecLog::kStderr), 10000);
}

TEST_F(ExecLogsTest, AFollowerGetsEveryByteAndEndsWhenTheExecEnds) {
  ExecLogs logs(dir(), 1 << 20);
  auto log = logs.Start("vm1", 3);
  std::string expected;
  for (int i = 0; i < 200; ++i) expected += "line " + std::to_string(i) + "\n";
  std::thread writer([&] {
    for (int i = 0; i < 200; ++i)
      log->Append(channel::kChanOut, "line " + std::to_string(i) + "\n");
    logs.Finish(3);
  });
  // The verb's loop: read what is there, wait for more until the exec has ended.
  std::string got;
  int64_t offset = 0;
  for (;;) {
    auto s = log->Read(ExecLog::kStdout, offset, 64);
    ASSERT_TRUE(s.ok());
    if (!s->data.empty()) {
      got += s->data;
      offset += static_cast<int64_t>(s->data.size());
      continue;
    }
    if (s->finished) break;
    log->Wait(ExecLog::kStdout, offset, nullptr);
  }
  writer.join();
  EXPECT_EQ(got, expected);
  EXPECT_TRUE(log->finished());
}

TEST_F(ExecLogsTest, AWaitingFollowerReturnsWhenItsClientGoes) {
  ExecLogs logs(dir(), 1024);
  auto log = logs.Start("vm1", 4);
  std::atomic<bool> stop{false};
  std::thread client_gone([&] {
    stop = true;
    log->Wake();
  });
  log->Wait(ExecLog::kStdout, 0, &stop);  // returns: no output, exec still running
  client_gone.join();
  EXPECT_FALSE(log->finished());
}

TEST_F(ExecLogsTest, AnEndedLogIsReadBackFromItsFiles) {
  {
    ExecLogs logs(dir(), 100);
    auto log = logs.Start("vm1", 5);
    log->Append(channel::kChanOut, Pattern(0, 300));
    log->Append(channel::kChanErr, "bad\n");
    logs.Finish(5);
  }
  // A new service (a restarted daemon) over the same directory, with another cap.
  ExecLogs again(dir(), 10);
  auto log = again.Open("vm1", 5);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  EXPECT_TRUE((*log)->finished());
  std::vector<std::pair<int64_t, int64_t>> gaps;
  EXPECT_EQ(ReadAll(**log, ExecLog::kStdout, 0, 1 << 20, &gaps), Pattern(0, 50) + Pattern(250, 50));
  EXPECT_EQ(gaps.size(), 1u);
  EXPECT_EQ(ReadAll(**log, ExecLog::kStderr, 0, 1 << 20), "bad\n");
  EXPECT_EQ(again.Open("vm1", 6).status().code(), Code::kNotFound);

  // A damaged file is an error of its own, never someone else's bytes.
  auto fd = OpenFile(dir() + "/vm1/5.out", O_WRONLY);
  ASSERT_TRUE(fd.ok());
  ASSERT_EQ(::pwrite(fd->get(), "XXXX", 4, 0), 4);
  auto damaged = again.Open("vm1", 5);
  ASSERT_TRUE(damaged.ok());
  auto r = (*damaged)->Read(ExecLog::kStdout, 0, 10);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("bad header"), std::string::npos) << r.status().message();

  ASSERT_TRUE(again.RemoveVm("vm1").ok());
  EXPECT_EQ(again.Open("vm1", 5).status().code(), Code::kNotFound);
}

TEST_F(ExecLogsTest, ACapOfZeroKeepsNothingAndSaysSo) {
  ExecLogs logs(dir(), 0);
  auto log = logs.Start("vm1", 8);
  log->Append(channel::kChanOut, "x");
  EXPECT_EQ(log->total(ExecLog::kStdout), 1);
  auto r = log->Read(ExecLog::kStdout, 0, 10);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("cap is 0"), std::string::npos);
}

TEST_F(ExecLogsTest, ALogThatCannotBeCreatedStillCountsAndSaysWhy) {
  ASSERT_TRUE(WriteFileAtomic(dir() + "/vm1", "a file where the VM's directory goes").ok());
  ExecLogs logs(dir(), 1024);
  auto log = logs.Start("vm1", 9);
  log->Append(channel::kChanOut, "abc");
  EXPECT_EQ(log->total(ExecLog::kStdout), 3);
  auto r = log->Read(ExecLog::kStdout, 0, 10);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("could not be kept"), std::string::npos);
}

}  // namespace
}  // namespace trybox::daemon

namespace trybox::daemon {
namespace {

// Issue 51.6: 20 execs of a live VM printing 8 MiB each made 77 MB of logs that nothing
// bounded. With a per-VM cap the oldest finished execs' logs go first, each leaving a note
// a reader gets, and the VM's logs stay under the cap (what the disk budget counts).
TEST_F(ExecLogsTest, AVmsLogsStayUnderItsCapOldestFinishedTrimmedFirstWithANote) {
  const int64_t cap = 64 << 10;            // 64 KiB per stream
  const int64_t vm_cap = 5 * 2 * cap / 2;  // room for about 5 execs' logs
  ExecLogs logs(dir(), cap, vm_cap);
  std::shared_ptr<ExecLog> live = logs.Start("vm1", 100);  // running throughout
  live->Append(channel::kChanOut, Pattern(0, 3 * cap));
  for (int64_t id = 1; id <= 20; ++id) {
    auto log = logs.Start("vm1", id);
    log->Append(channel::kChanOut, Pattern(0, 2 * cap));
    log->Append(channel::kChanErr, "err " + std::to_string(id));
    logs.Finish(id);
    // The running exec's log and the newest finished one's are never trimmed.
    EXPECT_LE(logs.VmBytes("vm1"), vm_cap + 2 * (cap + 8192) + 8192) << "after exec " << id;
  }
  EXPECT_LE(logs.VmBytes("vm1"), vm_cap + 2 * (cap + 8192) + 8192);
  // The oldest is trimmed and says so.
  auto old = logs.Open("vm1", 1);
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  auto r = (*old)->Read(ExecLog::kStdout, 0, 100);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("was trimmed"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("--exec-log-vm-cap"), std::string::npos);
  // The newest is whole.
  auto last = logs.Open("vm1", 20);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(ReadAll(**last, ExecLog::kStderr, 0, 4096), "err 20");
  // The live exec's log was kept: it goes on.
  live->Append(channel::kChanOut, "more");
  EXPECT_EQ(live->total(ExecLog::kStdout), 3 * cap + 4);
  auto head = live->Read(ExecLog::kStdout, 0, 16);
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(head->data, Pattern(0, 16));
  logs.Finish(100);
}

TEST_F(ExecLogsTest, WithoutAVmCapNothingIsTrimmed) {
  ExecLogs logs(dir(), 4096);
  for (int64_t id = 1; id <= 10; ++id) {
    auto log = logs.Start("vm1", id);
    log->Append(channel::kChanOut, Pattern(0, 8192));
    logs.Finish(id);
  }
  auto first = logs.Open("vm1", 1);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(ReadAll(**first, ExecLog::kStdout, 0, 4096).size(), 4096u);
}

}  // namespace
}  // namespace trybox::daemon
