// GuestOps against guests over real socketpairs: trybox-init's own put/get handlers for
// files, and a raw peer writing hand-made frames for everything a hostile guest can send
// (malformed ENDs, events and resets, a channel dropped mid-exec). The client side of an
// exec is a second real Mux connection, as the daemon's socket is.
#include "daemon/guest_ops.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "channel/frame.h"
#include "guest/files.h"
#include "guest/reaper.h"
#include "util/fd.h"

namespace trybox::daemon {
namespace {

using channel::FrameType;
using channel::Mux;
using channel::Stream;
using Kind = Stream::Message::Kind;

// The host end of a guest connection, as a GuestChannel.
class MuxGuest : public GuestChannel {
 public:
  explicit MuxGuest(UniqueFd fd) : mux_(std::move(fd), channel::Role::kHost) { mux_.Start(); }
  Result<std::shared_ptr<Stream>> Open(const Json& r) override { return mux_.Open(r); }
  bool alive() const override { return mux_.alive(); }
  std::string death_reason() const override { return mux_.death_reason(); }

 private:
  Mux mux_;
};

// The guest end as raw bytes: the test reads the host's frames and writes its own.
class RawPeer {
 public:
  explicit RawPeer(UniqueFd fd) : fd_(std::move(fd)) {}
  // The next frame from the host (skips CREDIT frames).
  channel::Frame Read() {
    for (;;) {
      auto f = decoder_.Next();
      if (f.ok()) {
        if (f->type == FrameType::kCredit) continue;
        return *f;
      }
      char buf[65536];
      ssize_t n = ::read(fd_.get(), buf, sizeof buf);
      if (n <= 0) return channel::Frame{0, FrameType::kReset, 0, "peer closed"};
      decoder_.Feed(std::string_view(buf, static_cast<size_t>(n)));
    }
  }
  void Send(uint32_t stream, FrameType type, uint8_t ch, const std::string& payload) {
    std::string bytes = channel::EncodeFrame({stream, type, ch, payload});
    ASSERT_EQ(::write(fd_.get(), bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  void Json(uint32_t stream, FrameType type, const std::string& text) {
    Send(stream, type, 0, text);
  }
  void Close() { fd_.Reset(); }

 private:
  UniqueFd fd_;
  channel::FrameDecoder decoder_;
};

struct Hostile {
  std::unique_ptr<MuxGuest> guest;
  std::unique_ptr<RawPeer> peer;
};

Hostile MakeHostile() {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  return {std::make_unique<MuxGuest>(UniqueFd(sv[0])), std::make_unique<RawPeer>(UniqueFd(sv[1]))};
}

// A client connection: `client` is what the CLI holds, `server` what the daemon's verb sees.
struct ClientConn {
  std::unique_ptr<Mux> cli, daemon;
  std::shared_ptr<Stream> client, server;
};

ClientConn MakeClient(const Json& request = {{"verb", "exec"}}) {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  ClientConn c;
  c.cli = std::make_unique<Mux>(UniqueFd(sv[0]), channel::Role::kHost);
  c.daemon = std::make_unique<Mux>(UniqueFd(sv[1]), channel::Role::kGuest);
  std::promise<std::shared_ptr<Stream>> got;
  c.daemon->OnOpen([&got](std::shared_ptr<Stream> s, Json) { got.set_value(s); });
  c.cli->Start();
  c.daemon->Start();
  c.client = *c.cli->Open(request);
  c.server = got.get_future().get();
  return c;
}

// Runs `fn` (a RunExec) on a thread while the test plays the guest.
template <typename F>
auto Async(F fn) {
  return std::async(std::launch::async, std::move(fn));
}

TEST(GuestOpsExecTest, RelaysOutputAndReturnsTheGuestsResult) {
  Hostile h = MakeHostile();
  ClientConn c = MakeClient();
  ExecSpec spec;
  spec.argv = {"x"};
  std::string capture;
  auto fut = Async([&] {
    ExecIo io;
    io.client = c.server.get();
    io.capture = &capture;
    return RunExec(*h.guest, spec, io);
  });
  channel::Frame open = h.peer->Read();
  ASSERT_EQ(open.type, FrameType::kOpen);
  Json req = Json::parse(open.payload);
  EXPECT_EQ(req["op"], "exec");
  EXPECT_EQ(req["argv"], Json::array({"x"}));
  EXPECT_FALSE(req.contains("user"));
  h.peer->Json(open.stream, FrameType::kEvent, R"({"type":"started","pid":42})");
  h.peer->Send(open.stream, FrameType::kData, 1, "out");
  h.peer->Send(open.stream, FrameType::kData, 2, "err!");
  h.peer->Send(open.stream, FrameType::kEof, 1, "");
  h.peer->Send(open.stream, FrameType::kEof, 2, "");
  h.peer->Json(open.stream, FrameType::kEnd,
               R"({"outcome":"exited","exit_code":3,"duration_ms":7})");
  ExecResult r = fut.get();
  EXPECT_EQ(r.outcome, ExecOutcome::kExited);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.duration_ms, 7);
  EXPECT_EQ(r.stdout_bytes, 3);
  EXPECT_EQ(r.stderr_bytes, 4);
  EXPECT_EQ(capture, "outerr!");
  std::string out, err;
  Json event;
  for (int i = 0; i < 5; ++i) {
    auto m = c.client->Next();
    ASSERT_TRUE(m.ok());
    if (m->kind == Kind::kEvent) event = m->body;
    if (m->kind == Kind::kData) (m->channel == 1 ? out : err) += m->data;
  }
  EXPECT_EQ(event, (Json{{"type", "started"}, {"pid", 42}}));
  EXPECT_EQ(out, "out");
  EXPECT_EQ(err, "err!");
  EXPECT_EQ(r.ToJson(), (Json{{"outcome", "exited"}, {"exit_code", 3}, {"duration_ms", 7}}));
}

TEST(GuestOpsExecTest, MalformedEndsAreErrorsOfTheirOwnNameNeverExitCodes) {
  for (const char* end :
       {R"({"outcome":1})", R"({"type":1})", R"({"outcome":"exited"})",
        R"({"outcome":"exited","exit_code":"0"})", R"({"outcome":"exited","exit_code":0.5})",
        R"({"outcome":"exited","exit_code":300})", R"({"outcome":"signaled","signal":"9"})",
        R"({"outcome":"timed_out"})", R"({"outcome":"error","error":2})",
        R"({"outcome":"exited","exit_code":0,"duration_ms":-1})",
        R"({"outcome":"exited","exit_code":0,"message":[1]})", R"({"outcome":"won"})", R"([1,2])",
        R"("exited")"}) {
    Hostile h = MakeHostile();
    auto fut = Async([&] { return RunExec(*h.guest, ExecSpec{{"x"}}, ExecIo{}); });
    channel::Frame open = h.peer->Read();
    h.peer->Json(open.stream, FrameType::kEnd, end);
    ExecResult r = fut.get();
    // A non-object END is a malformed frame: the stream is reset, the channel lives on; the
    // command never said it started.
    if (std::string(end)[0] != '{') {
      EXPECT_EQ(r.outcome, ExecOutcome::kNotStarted) << end;
      continue;
    }
    EXPECT_EQ(r.outcome, ExecOutcome::kError) << end;
    EXPECT_EQ(r.error, "bad_guest_reply") << end;
    EXPECT_FALSE(r.exit_code.has_value()) << end;
    EXPECT_TRUE(h.guest->alive());
  }
}

TEST(GuestOpsExecTest, MalformedEventResetsTheStreamAndNamesIt) {
  Hostile h = MakeHostile();
  auto fut = Async([&] { return RunExec(*h.guest, ExecSpec{{"x"}}, ExecIo{}); });
  channel::Frame open = h.peer->Read();
  h.peer->Json(open.stream, FrameType::kEvent, R"({"type":1})");
  channel::Frame reset = h.peer->Read();
  EXPECT_EQ(reset.type, FrameType::kReset);
  EXPECT_EQ(reset.stream, open.stream);
  ExecResult r = fut.get();
  EXPECT_EQ(r.outcome, ExecOutcome::kError);
  EXPECT_EQ(r.error, "bad_guest_reply");
  EXPECT_NE(r.message.find("'type'"), std::string::npos) << r.message;
}

TEST(GuestOpsExecTest, ResetWithAReasonOfTheWrongTypeIsAGuestAbort) {
  Hostile h = MakeHostile();
  auto fut = Async([&] { return RunExec(*h.guest, ExecSpec{{"x"}}, ExecIo{}); });
  channel::Frame open = h.peer->Read();
  h.peer->Json(open.stream, FrameType::kEvent, R"({"type":"started","pid":42})");
  h.peer->Json(open.stream, FrameType::kReset, R"({"reason":1})");
  ExecResult r = fut.get();
  EXPECT_EQ(r.outcome, ExecOutcome::kChannelLost);
  EXPECT_NE(r.message.find("the guest aborted the request"), std::string::npos) << r.message;
}

TEST(GuestOpsExecTest, GarbageOnStreamZeroClosesTheChannelWithItsName) {
  for (const char* event : {R"([1,2])", R"(7)"}) {
    Hostile h = MakeHostile();
    auto fut = Async([&] { return RunExec(*h.guest, ExecSpec{{"x"}}, ExecIo{}); });
    channel::Frame open = h.peer->Read();
    h.peer->Json(open.stream, FrameType::kEvent, R"({"type":"started","pid":42})");
    h.peer->Json(0, FrameType::kEvent, event);
    ExecResult r = fut.get();
    EXPECT_EQ(r.outcome, ExecOutcome::kChannelLost) << event;
    EXPECT_FALSE(h.guest->alive());
    EXPECT_NE(h.guest->death_reason().find("malformed control event"), std::string::npos)
        << h.guest->death_reason();
  }
}

TEST(GuestOpsExecTest, ChannelClosedBeforeTheEndIsChannelLostNotAnExitCode) {
  Hostile h = MakeHostile();
  auto fut = Async([&] { return RunExec(*h.guest, ExecSpec{{"x"}}, ExecIo{}); });
  channel::Frame open = h.peer->Read();
  h.peer->Json(open.stream, FrameType::kEvent, R"({"type":"started","pid":42})");
  h.peer->Send(open.stream, FrameType::kData, 1, "partial");
  h.peer->Close();
  ExecResult r = fut.get();
  EXPECT_EQ(r.outcome, ExecOutcome::kChannelLost);
  EXPECT_FALSE(r.exit_code.has_value());
  EXPECT_NE(r.message.find("the guest is gone"), std::string::npos) << r.message;
}

TEST(GuestOpsExecTest, AGuestLostBeforeTheCommandStartedIsNotStartedNotChannelLost) {
  // An exec on a VM whose QEMU had died used to be recorded as channel_lost: a command
  // that never started, recorded as one that ran and lost its channel.
  Hostile h = MakeHostile();
  auto fut = Async([&] { return RunExec(*h.guest, ExecSpec{{"x"}}, ExecIo{}); });
  (void)h.peer->Read();
  h.peer->Close();
  ExecResult r = fut.get();
  EXPECT_EQ(r.outcome, ExecOutcome::kNotStarted);
  EXPECT_EQ(r.ToJson()["outcome"], "not_started");
  EXPECT_FALSE(r.exit_code.has_value());
  // And a guest already gone refuses the open itself.
  ExecResult again = RunExec(*h.guest, ExecSpec{{"x"}}, ExecIo{});
  EXPECT_EQ(again.outcome, ExecOutcome::kNotStarted);
}

TEST(GuestOpsExecTest, AGuestSilentPastTheTimeoutAndGraceIsUnresponsive) {
  // The timeout lived only in the guest: a stopped guest kept the exec waiting for ever.
  Hostile h = MakeHostile();
  ExecSpec spec{{"sleep", "60"}};
  spec.timeout_ms = 50;
  spec.host_grace_ms = 100;
  auto fut = Async([&] { return RunExec(*h.guest, spec, ExecIo{}); });
  channel::Frame open = h.peer->Read();
  h.peer->Json(open.stream, FrameType::kEvent, R"({"type":"started","pid":42})");
  // The guest says nothing more; the host gives up on it and tells it so.
  ExecResult r = fut.get();
  EXPECT_EQ(r.outcome, ExecOutcome::kGuestUnresponsive);
  EXPECT_EQ(r.ToJson()["outcome"], "guest_unresponsive");
  EXPECT_FALSE(r.exit_code.has_value());
  EXPECT_NE(r.message.find("timeout of 50 ms"), std::string::npos) << r.message;
  channel::Frame reset = h.peer->Read();
  EXPECT_EQ(reset.type, FrameType::kReset);
  EXPECT_EQ(reset.stream, open.stream);
}

// A guest the heartbeat can declare unresponsive, as VmEntry does.
class FlaggedGuest : public MuxGuest {
 public:
  using MuxGuest::MuxGuest;
  bool unresponsive() const override { return flag; }
  std::atomic<bool> flag{false};
};

TEST(GuestOpsExecTest, AnExecWithNoTimeoutEndsWhenTheHeartbeatGivesUpOnTheGuest) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  FlaggedGuest guest{UniqueFd(sv[0])};
  RawPeer peer{UniqueFd(sv[1])};
  std::promise<std::shared_ptr<Stream>> opened;
  auto fut = Async([&] {
    ExecIo io;
    io.on_open = [&](std::shared_ptr<Stream> s) { opened.set_value(std::move(s)); };
    return RunExec(guest, ExecSpec{{"sleep", "60"}}, io);
  });
  channel::Frame open = peer.Read();
  peer.Json(open.stream, FrameType::kEvent, R"({"type":"started","pid":42})");
  std::shared_ptr<Stream> s = opened.get_future().get();
  // What the heartbeat does to the streams of a guest that stopped answering.
  guest.flag = true;
  s->Interrupt();
  ExecResult r = fut.get();
  EXPECT_EQ(r.outcome, ExecOutcome::kGuestUnresponsive);
  EXPECT_NE(r.message.find("heartbeat"), std::string::npos) << r.message;
  EXPECT_FALSE(r.exit_code.has_value());
}

TEST(GuestOpsExecTest, AClientThatResetsCancelsTheCommandInTheGuest) {
  Hostile h = MakeHostile();
  ClientConn c = MakeClient();
  auto fut = Async([&] {
    ExecIo io;
    io.client = c.server.get();
    return RunExec(*h.guest, ExecSpec{{"sleep", "100"}}, io);
  });
  channel::Frame open = h.peer->Read();
  ASSERT_TRUE(c.client->Reset("user pressed Ctrl-C").ok());
  channel::Frame reset = h.peer->Read();
  EXPECT_EQ(reset.type, FrameType::kReset);
  EXPECT_EQ(reset.stream, open.stream);
  ExecResult r = fut.get();
  EXPECT_EQ(r.outcome, ExecOutcome::kCancelled);
}

TEST(GuestOpsExecTest, EndsAsSoonAsTheGuestEndsWithNoTimerWhileInputStaysOpen) {
  // The watcher of the client's stream used to wake every 100 ms to see whether the exec
  // had ended: every exec waited for its next tick. Now it sleeps once and is interrupted.
  Hostile h = MakeHostile();
  ClientConn c = MakeClient();
  ExecSpec spec{{"cat"}};
  spec.stdin = true;
  auto fut = Async([&] {
    ExecIo io;
    io.client = c.server.get();
    return RunExec(*h.guest, spec, io);
  });
  channel::Frame open = h.peer->Read();
  ASSERT_TRUE(c.client->Write(channel::kChanIn, "in").ok());
  channel::Frame data = h.peer->Read();
  EXPECT_EQ(data.type, FrameType::kData);
  EXPECT_EQ(data.payload, "in");
  // The command runs a while; the client keeps its input open the whole time.
  std::this_thread::sleep_for(std::chrono::milliseconds(450));
  h.peer->Json(open.stream, FrameType::kEnd, R"({"outcome":"exited","exit_code":0})");
  ExecResult r = fut.get();
  EXPECT_EQ(r.outcome, ExecOutcome::kExited);
  // One sleep before the input arrived, one after: no periodic wake-ups in 450 ms.
  EXPECT_LE(c.server->wakeups(), 3u);
}

TEST(GuestOpsExecTest, RequestCarriesUserAndPrivilegesOnlyWhenSet) {
  ExecSpec spec{{"id"}};
  EXPECT_FALSE(GuestExecRequest(spec).contains("user"));
  EXPECT_FALSE(GuestExecRequest(spec).contains("privileged"));
  spec.user = "user";
  spec.privileged = true;
  Json req = GuestExecRequest(spec);
  EXPECT_EQ(req["user"], "user");
  EXPECT_EQ(req["privileged"], true);
}

// An empty cwd leaves it to the guest, which runs the command in its account's home.
TEST(GuestOpsExecTest, RequestLeavesCwdToTheGuestWhenEmpty) {
  ExecSpec spec{{"id"}};
  EXPECT_EQ(GuestExecRequest(spec)["cwd"], "/root");
  spec.cwd = "";
  EXPECT_FALSE(GuestExecRequest(spec).contains("cwd"));
}

// ---- files, against trybox-init's own handlers ----

// trybox-init's handlers fork tar through its reaper, which takes SIGCHLD with sigwaitinfo
// and reaps with waitpid(-1): it needs SIGCHLD blocked in every thread and a process of its
// own, as in the guest. In this process it would have neither (a get of a directory once
// waited forever on a tar no one reaped), so each test runs in a death-test child,
// re-executed so that no thread exists before SIGCHLD is blocked; the child exits 0 iff no
// check in it failed, and its checks' messages are shown when one did.
class GuestOpsFilesTest : public ::testing::Test {
 protected:
  void InGuestProcess(const std::function<void()>& body) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
          guest::BlockChildSignal();
          // The child's checks are collected and printed here: a death test shows only
          // the child's stderr.
          ::testing::TestPartResultArray results;
          {
            ::testing::ScopedFakeTestPartResultReporter collect(
                ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ALL_THREADS, &results);
            Start();
            body();
            Stop();
          }
          int failed = 0;
          for (int i = 0; i < results.size(); ++i) {
            const ::testing::TestPartResult& r = results.GetTestPartResult(i);
            if (!r.failed()) continue;
            ++failed;
            std::fprintf(stderr, "%s:%d: %s\n", r.file_name() ? r.file_name() : "?",
                         r.line_number(), r.message());
          }
          std::fflush(stderr);
          std::_Exit(failed == 0 ? 0 : 1);
        },
        ::testing::ExitedWithCode(0), "");
  }
  std::string Path(const std::string& name) { return dir_->path() + "/" + name; }

  std::unique_ptr<MuxGuest> guest_;

 private:
  void Start() {
    guest_side_->reaper.Start();
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    guest_mux_ = std::make_unique<Mux>(UniqueFd(sv[1]), channel::Role::kGuest);
    guest_mux_->OnOpen([g = guest_side_](std::shared_ptr<Stream> s, Json req) {
      {
        std::lock_guard<std::mutex> lock(g->mu);
        ++g->running;
      }
      if (req["op"] == "put") guest::ServePut(g->reaper, *s, req);
      if (req["op"] == "get") guest::ServeGet(g->reaper, *s, req);
      std::lock_guard<std::mutex> lock(g->mu);
      --g->running;
      g->cv.notify_all();
    });
    guest_mux_->Start();
    guest_ = std::make_unique<MuxGuest>(UniqueFd(sv[0]));
    auto dir = TempDir::Make(::testing::TempDir(), "guest_ops_test");
    ASSERT_TRUE(dir.ok());
    dir_.emplace(std::move(dir).value());
  }
  // The guest's handlers run on detached threads of their own (as in trybox-init), which may
  // still be finishing a request the host has given up on (a get of a directory): the host
  // side closes first, so that none waits on it, and then those running are waited for.
  void Stop() {
    guest_.reset();
    std::unique_lock<std::mutex> lock(guest_side_->mu);
    guest_side_->cv.wait(lock, [this] { return guest_side_->running == 0; });
  }

  struct GuestSide {
    guest::Reaper reaper;
    std::mutex mu;
    std::condition_variable cv;
    int running = 0;
  };
  std::shared_ptr<GuestSide> guest_side_ = std::make_shared<GuestSide>();
  std::unique_ptr<Mux> guest_mux_;
  std::optional<TempDir> dir_;
};

TEST_F(GuestOpsFilesTest, WriteThenReadRoundTrips) {
  InGuestProcess([&] {
    std::string data(300000, 'z');
    ASSERT_TRUE(WriteFile(*guest_, Path("a/b.txt"), data, 0600, /*mkdirs=*/true).ok());
    auto r = ReadFile(*guest_, Path("a/b.txt"), 1 << 20);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->data, data);
    EXPECT_FALSE(r->truncated);
    EXPECT_EQ(r->size, 300000);
    auto cut = ReadFile(*guest_, Path("a/b.txt"), 1000);
    ASSERT_TRUE(cut.ok());
    EXPECT_EQ(cut->data.size(), 1000u);
    EXPECT_TRUE(cut->truncated);
  });
}

TEST_F(GuestOpsFilesTest, ReadOfADirectoryOrAMissingFileSaysWhich) {
  InGuestProcess([&] {
    ASSERT_TRUE(WriteFile(*guest_, Path("d/f"), "x", 0644, true).ok());
    auto dir = ReadFile(*guest_, Path("d"), 100);
    EXPECT_EQ(dir.status().code(), Code::kFailedPrecondition) << dir.status().ToString();
    EXPECT_NE(dir.status().message().find("directory"), std::string::npos);
    auto missing = ReadFile(*guest_, Path("nope"), 100);
    EXPECT_EQ(missing.status().code(), Code::kNotFound) << missing.status().ToString();
    Status no_parent = WriteFile(*guest_, Path("x/y/z"), "x", 0644, /*mkdirs=*/false);
    EXPECT_FALSE(no_parent.ok());
  });
}

TEST_F(GuestOpsFilesTest, GetRelaysMetaDataAndEndToTheClient) {
  InGuestProcess([&] {
    ASSERT_TRUE(WriteFile(*guest_, Path("g"), "hello", 0640, true).ok());
    ClientConn c = MakeClient({{"verb", "get"}});
    RelayGet(*guest_, {{"op", "get"}, {"path", Path("g")}}, *c.server);
    Json meta, end;
    std::string data;
    for (;;) {
      auto m = c.client->Next();
      ASSERT_TRUE(m.ok());
      if (m->kind == Kind::kEvent) meta = m->body;
      if (m->kind == Kind::kData) data += m->data;
      if (m->kind == Kind::kEnd) {
        end = m->body;
        break;
      }
    }
    EXPECT_EQ(meta["type"], "meta");
    EXPECT_EQ(meta["kind"], "file");
    EXPECT_EQ(meta["mode"], 0640);
    EXPECT_EQ(data, "hello");
    EXPECT_EQ(end, (Json{{"ok", true}, {"bytes", 5}, {"via", "channel"}}));
  });
}

TEST_F(GuestOpsFilesTest, PutErrorsKeepTheGuestsKind) {
  InGuestProcess([&] {
    ClientConn c = MakeClient({{"verb", "put"}});
    std::thread upload([&] {
      (void)c.client->Write(channel::kChanIn, "data");
      (void)c.client->CloseWrite(channel::kChanIn);
    });
    RelayPut(*guest_, {{"op", "put"}, {"path", Path("missing/dir/f")}, {"kind", "file"}},
             *c.server);
    upload.join();
    Json end;
    for (;;) {
      auto m = c.client->Next();
      ASSERT_TRUE(m.ok());
      if (m->kind == Kind::kEnd) {
        end = m->body;
        break;
      }
    }
    EXPECT_EQ(end["ok"], false);
    EXPECT_EQ(end["error"]["code"], "NOT_FOUND") << end.dump();
    EXPECT_EQ(end["error"]["kind"], "not_found") << end.dump();
  });
}

TEST(GuestOpsFilesHostileTest, MalformedFileEndsAreNamedNotThrown) {
  for (const char* end :
       {R"({"ok":"yes"})", R"({"ok":false})", R"({"ok":false,"error":1})", R"({})"}) {
    Hostile h = MakeHostile();
    auto fut = Async([&] { return ReadFile(*h.guest, "/x", 10); });
    channel::Frame open = h.peer->Read();
    h.peer->Json(open.stream, FrameType::kEnd, end);
    auto r = fut.get();
    EXPECT_FALSE(r.ok()) << end;
    EXPECT_NE(r.status().message().find("malformed"), std::string::npos) << r.status().message();
  }
}

// Collects what an exec's sink is given, in order.
class RecordingSink : public OutputSink {
 public:
  void Append(uint8_t channel, std::string_view data) override {
    out += std::to_string(channel) + ":" + std::string(data) + ";";
  }
  std::string out;
};

TEST(GuestOpsExecTest, OutputReachesTheSinkAndStartedIsReported) {
  Hostile h = MakeHostile();
  RecordingSink sink;
  std::atomic<int> started{0};
  auto fut = Async([&] {
    ExecIo io;
    io.sink = &sink;
    io.on_started = [&] { ++started; };
    return RunExec(*h.guest, ExecSpec{{"x"}}, io);
  });
  channel::Frame open = h.peer->Read();
  h.peer->Json(open.stream, FrameType::kEvent, R"({"type":"started","pid":42})");
  h.peer->Send(open.stream, FrameType::kData, 1, "out");
  h.peer->Send(open.stream, FrameType::kData, 2, "err");
  h.peer->Send(open.stream, FrameType::kData, 1, "more");
  h.peer->Json(open.stream, FrameType::kEnd, R"({"outcome":"exited","exit_code":0})");
  EXPECT_EQ(fut.get().outcome, ExecOutcome::kExited);
  EXPECT_EQ(sink.out, "1:out;2:err;1:more;");
  EXPECT_EQ(started, 1);
}

TEST(GuestOpsExecTest, ATerminalExecRelaysTheClientsResizesRebuiltFromTheirFields) {
  Hostile h = MakeHostile();
  ClientConn c = MakeClient();
  ExecSpec spec{{"bash"}};
  spec.tty = TermSize{24, 80};
  auto fut = Async([&] {
    ExecIo io;
    io.client = c.server.get();
    return RunExec(*h.guest, spec, io);
  });
  channel::Frame open = h.peer->Read();
  Json req = Json::parse(open.payload);
  EXPECT_EQ(req["tty"], (Json{{"rows", 24}, {"cols", 80}}));
  ASSERT_TRUE(
      c.client->SendEvent({{"type", "resize"}, {"rows", 50}, {"cols", 132}, {"x", 1}}).ok());
  channel::Frame ev = h.peer->Read();
  ASSERT_EQ(ev.type, FrameType::kEvent);
  EXPECT_EQ(Json::parse(ev.payload), (Json{{"type", "resize"}, {"rows", 50}, {"cols", 132}}));
  // Terminal input is forwarded though the request had no "stdin".
  ASSERT_TRUE(c.client->Write(channel::kChanIn, "ls\r").ok());
  channel::Frame data = h.peer->Read();
  EXPECT_EQ(data.type, FrameType::kData);
  EXPECT_EQ(data.payload, "ls\r");
  h.peer->Json(open.stream, FrameType::kEnd, R"({"outcome":"exited","exit_code":0})");
  EXPECT_EQ(fut.get().outcome, ExecOutcome::kExited);
}

TEST(GuestOpsExecTest, AClientEventThatIsNotAResizeOfATerminalCancelsTheExec) {
  const Json bad[] = {{{"type", "signal"}, {"signal", 9}},
                      {{"type", "resize"}, {"rows", 0}, {"cols", 80}},
                      {{"type", "resize"}, {"rows", "24"}, {"cols", 80}},
                      {{"rows", 24}, {"cols", 80}}};
  for (bool tty : {true, false}) {
    for (const Json& event : bad) {
      if (!tty && event.value("type", "") != "resize") continue;
      Hostile h = MakeHostile();
      ClientConn c = MakeClient();
      ExecSpec spec{{"bash"}};
      if (tty) spec.tty = TermSize{24, 80};
      auto fut = Async([&] {
        ExecIo io;
        io.client = c.server.get();
        return RunExec(*h.guest, spec, io);
      });
      channel::Frame open = h.peer->Read();
      ASSERT_TRUE(c.client->SendEvent(event).ok());
      channel::Frame reset = h.peer->Read();  // the event itself never reaches the guest
      EXPECT_EQ(reset.type, FrameType::kReset) << event.dump();
      ExecResult r = fut.get();
      EXPECT_EQ(r.outcome, ExecOutcome::kCancelled) << event.dump();
      EXPECT_NE(r.message.find("bad event"), std::string::npos) << r.message;
    }
  }
  // A well-formed resize of an exec without a terminal is refused too.
  Hostile h = MakeHostile();
  ClientConn c = MakeClient();
  auto fut = Async([&] {
    ExecIo io;
    io.client = c.server.get();
    return RunExec(*h.guest, ExecSpec{{"x"}}, io);
  });
  (void)h.peer->Read();
  ASSERT_TRUE(c.client->SendEvent({{"type", "resize"}, {"rows", 5}, {"cols", 5}}).ok());
  EXPECT_EQ(h.peer->Read().type, FrameType::kReset);
  ExecResult r = fut.get();
  EXPECT_NE(r.message.find("without a terminal"), std::string::npos) << r.message;
}

TEST(GuestOpsPortTest, RelaysBytesBothWaysAndTheGuestsResult) {
  Hostile h = MakeHostile();
  ClientConn c = MakeClient({{"verb", "port"}});
  std::thread relay([&] { RelayPort(*h.guest, 8000, *c.server); });
  channel::Frame open = h.peer->Read();
  EXPECT_EQ(Json::parse(open.payload), (Json{{"op", "port"}, {"port", 8000}}));
  ASSERT_TRUE(c.client->Write(channel::kChanIn, "GET /").ok());
  ASSERT_TRUE(c.client->CloseWrite(channel::kChanIn).ok());
  channel::Frame up = h.peer->Read();
  EXPECT_EQ(up.payload, "GET /");
  channel::Frame eof = h.peer->Read();
  EXPECT_EQ(eof.type, FrameType::kEof);
  h.peer->Send(open.stream, FrameType::kData, 1, "200 OK");
  h.peer->Send(open.stream, FrameType::kEof, 1, "");
  h.peer->Json(open.stream, FrameType::kEnd, R"({"ok":true,"bytes_in":5,"bytes_out":6})");
  std::string down;
  Json end;
  for (;;) {
    auto m = c.client->Next();
    ASSERT_TRUE(m.ok());
    if (m->kind == Kind::kData) down += m->data;
    if (m->kind == Kind::kEnd) {
      end = m->body;
      break;
    }
  }
  relay.join();
  EXPECT_EQ(down, "200 OK");
  EXPECT_EQ(end, (Json{{"ok", true}, {"bytes_in", 5}, {"bytes_out", 6}}));
}

// A control request's three ends: the END's body when it says ok, the guest's refusal with
// its reason (no_space as RESOURCE_EXHAUSTED), and a channel lost before any END as the
// guest's death, never as a refusal or a success.
TEST(GuestOpsCallTest, AnOkEndARefusalAndALostGuestAreThreeDifferentResults) {
  struct Case {
    const char* end;  // null: the guest's channel closes instead
    Code code;
    const char* text;
  };
  for (const Case& c :
       {Case{R"({"ok":true,"bytes":7})", Code::kOk, ""},
        Case{R"({"ok":false,"error":"busy","message":"frozen already"})", Code::kFailedPrecondition,
             "the guest could not mount the disk: busy: frozen already"},
        Case{R"({"ok":false,"error":"no_space"})", Code::kResourceExhausted,
             "the guest could not mount the disk: no_space"},
        Case{R"({"error":"unknown op"})", Code::kFailedPrecondition,
             "the guest could not mount the disk: unknown op"},
        Case{nullptr, Code::kUnavailable, "the guest is gone"}}) {
    Hostile h = MakeHostile();
    auto fut = Async([&] { return GuestCall(*h.guest, {{"op", "mount"}}, "mount the disk"); });
    channel::Frame open = h.peer->Read();
    EXPECT_EQ(Json::parse(open.payload)["op"], "mount");
    if (c.end) {
      h.peer->Json(open.stream, FrameType::kEnd, c.end);
    } else {
      h.peer->Close();
    }
    Result<Json> r = fut.get();
    EXPECT_EQ(r.status().code(), c.code) << r.status().ToString();
    if (r.ok()) {
      EXPECT_EQ((*r)["bytes"], 7);
    } else {
      EXPECT_NE(r.status().message().find(c.text), std::string::npos) << r.status().ToString();
    }
  }
}

TEST(GuestOpsPortTest, AGuestConnectFailureKeepsItsKindAndAMalformedEndIsNamed) {
  for (const char* guest_end : {R"({"ok":false,"error":"connect_failed","message":"refused"})",
                                R"({"ok":true,"bytes_in":"5"})"}) {
    Hostile h = MakeHostile();
    ClientConn c = MakeClient({{"verb", "port"}});
    std::thread relay([&] { RelayPort(*h.guest, 8000, *c.server); });
    channel::Frame open = h.peer->Read();
    h.peer->Json(open.stream, FrameType::kEnd, guest_end);
    auto got = AwaitEnd(*c.client);
    relay.join();
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    Json end = *got;
    EXPECT_EQ(end["ok"], false) << end.dump();
    if (std::string(guest_end).find("connect_failed") != std::string::npos) {
      EXPECT_EQ(end["error"]["kind"], "connect_failed");
      EXPECT_EQ(end["error"]["code"], "UNAVAILABLE");
    } else {
      EXPECT_NE(end["error"]["message"].get<std::string>().find("bytes_in"), std::string::npos);
    }
  }
}

TEST(GuestOpsPortTest, AClientThatGoesAwayResetsTheGuestConnection) {
  Hostile h = MakeHostile();
  ClientConn c = MakeClient({{"verb", "port"}});
  std::thread relay([&] { RelayPort(*h.guest, 8000, *c.server); });
  channel::Frame open = h.peer->Read();
  ASSERT_TRUE(c.client->Reset("Ctrl-C").ok());
  channel::Frame reset = h.peer->Read();
  EXPECT_EQ(reset.type, FrameType::kReset);
  EXPECT_EQ(reset.stream, open.stream);
  relay.join();
}

}  // namespace
}  // namespace trybox::daemon

namespace trybox::daemon {
namespace {

// A guest whose host file system is full, or not.
class HostDiskGuest : public GuestChannel {
 public:
  explicit HostDiskGuest(std::string full) : full_(std::move(full)) {}
  Result<std::shared_ptr<Stream>> Open(const Json&) override { return Unavailable("unused"); }
  bool alive() const override { return true; }
  std::string death_reason() const override { return ""; }
  std::string host_no_space() const override { return full_; }

 private:
  std::string full_;
};

TEST(GuestOpsTransferTest, ATransferThatFailsOnAFullHostDiskIsNamedNoSpace) {
  // A full host disk reached the guest as an I/O error and was reported as one.
  HostDiskGuest full("the host's file system under /x is full (12 KiB free)");
  Json r = TransferErrorReply(full, Unavailable("tar: write error: Input/output error"), "io");
  EXPECT_EQ(r["ok"], false);
  EXPECT_EQ(r["error"]["kind"], "no_space");
  EXPECT_EQ(r["error"]["code"], CodeName(Code::kResourceExhausted));
  EXPECT_NE(r["error"]["message"].get<std::string>().find("12 KiB free"), std::string::npos);
  EXPECT_NE(r["error"]["message"].get<std::string>().find("Input/output error"), std::string::npos);
  // With room on the host, the guest's own kind stands.
  HostDiskGuest roomy("");
  r = TransferErrorReply(roomy, Unavailable("tar: write error"), "io");
  EXPECT_EQ(r["error"]["kind"], "io");
}

}  // namespace
}  // namespace trybox::daemon

namespace trybox::daemon {
namespace {

// A guest whose host disk filled once and has room again: some of its writes failed.
class DamagedGuest : public GuestChannel {
 public:
  Result<std::shared_ptr<Stream>> Open(const Json&) override { return Unavailable("unused"); }
  bool alive() const override { return true; }
  std::string death_reason() const override { return ""; }
  std::string host_disk_damage() const override {
    return "3 of its disk writes failed on the host: the host's file system under /x filled";
  }
};

// Issue 51.4: "the guest could not freeze /workspace: Input/output error" said nothing of
// the host's disk that caused it.
TEST(GuestOpsTransferTest, AnIoErrorOfAVmTheHostsDiskDamagedSaysSo) {
  DamagedGuest g;
  Status st = WithHostDiskCause(
      g, FailedPrecondition("the guest could not freeze /workspace: io: Input/output error"));
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("Input/output error (the host's disk caused it: 3 of its disk "
                              "writes failed on the host"),
            std::string::npos)
      << st.message();
  st = WithHostDiskCause(g, FailedPrecondition("tar: /x: Read-only file system"));
  EXPECT_NE(st.message().find("the host's disk caused it"), std::string::npos);
  // As a put reports it (seen in HostDiskE2E): lower case.
  st = WithHostDiskCause(g, FailedPrecondition("/root: read-only file system"));
  EXPECT_NE(st.message().find("the host's disk caused it"), std::string::npos);
  // Other failures keep their words, and their kind through a transfer's reply.
  st = WithHostDiskCause(g, NotFound("the guest could not get /nope: not found"));
  EXPECT_EQ(st.message(), "the guest could not get /nope: not found");
  Json r = TransferErrorReply(g, Unavailable("tar: write error: Input/output error"), "io");
  EXPECT_EQ(r["error"]["kind"], "io");
  EXPECT_NE(r["error"]["message"].get<std::string>().find("the host's disk caused it"),
            std::string::npos);
  // A VM the host's disk never failed: unchanged.
  HostDiskGuest roomy("");
  st = WithHostDiskCause(roomy, FailedPrecondition("x: Input/output error"));
  EXPECT_EQ(st.message(), "x: Input/output error");
}

}  // namespace
}  // namespace trybox::daemon
