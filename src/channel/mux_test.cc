#include "channel/mux.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

namespace trybox::channel {
namespace {

using Kind = Stream::Message::Kind;

struct Pair {
  std::unique_ptr<Mux> host, guest;
};

// A real socketpair with a host end and a guest end; the guest echoes requests.
Pair MakePair(Mux::OpenHandler guest_handler) {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  Pair p;
  p.host = std::make_unique<Mux>(UniqueFd(sv[0]), Role::kHost);
  p.guest = std::make_unique<Mux>(UniqueFd(sv[1]), Role::kGuest);
  p.guest->OnOpen(std::move(guest_handler));
  p.host->Start();
  p.guest->Start();
  return p;
}

// Reads the rest of a stream: data per channel, and the final message.
struct Drained {
  std::string out, err;
  Stream::Message last;
  Status status;
};
Drained Drain(Stream& s) {
  Drained d;
  for (;;) {
    auto m = s.Next();
    if (!m.ok()) {
      d.status = m.status();
      return d;
    }
    if (m->kind == Kind::kData) (m->channel == kChanErr ? d.err : d.out) += m->data;
    if (m->kind == Kind::kEnd || m->kind == Kind::kReset) {
      d.last = std::move(*m);
      return d;
    }
  }
}

TEST(MuxTest, RequestAndEndRoundTrip) {
  auto p = MakePair([](std::shared_ptr<Stream> s, Json req) {
    (void)s->End({{"echo", req["op"]}});
  });
  auto s = p.host->Open({{"op", "ping"}});
  ASSERT_TRUE(s.ok());
  auto d = Drain(**s);
  ASSERT_TRUE(d.status.ok()) << d.status.ToString();
  EXPECT_EQ(d.last.kind, Kind::kEnd);
  EXPECT_EQ(d.last.body["echo"], "ping");
  // After the END, the stream reports it ended rather than inventing more messages.
  EXPECT_EQ((*s)->Next().status().code(), Code::kFailedPrecondition);
}

TEST(MuxTest, LargeTransferIsByteExactThroughFlowControl) {
  // 3x the window each way forces many credit round trips.
  const size_t size = 3 * kInitialWindow + 12345;
  auto p = MakePair([](std::shared_ptr<Stream> s, Json) {
    std::string got;
    for (;;) {
      auto m = s->Next();
      if (!m.ok()) return;
      if (m->kind == Kind::kData) got += m->data;
      if (m->kind == Kind::kEof) break;
    }
    (void)s->Write(kChanOut, got);
    (void)s->CloseWrite(kChanOut);
    (void)s->End({{"bytes", got.size()}});
  });
  std::string payload(size, '\0');
  for (size_t i = 0; i < size; ++i) payload[i] = static_cast<char>((i * 2654435761u) >> 13);
  auto s = p.host->Open({{"op", "echo"}});
  ASSERT_TRUE(s.ok());
  std::thread writer([&] {
    ASSERT_TRUE((*s)->Write(kChanIn, payload).ok());
    ASSERT_TRUE((*s)->CloseWrite(kChanIn).ok());
  });
  auto d = Drain(**s);
  writer.join();
  ASSERT_TRUE(d.status.ok()) << d.status.ToString();
  EXPECT_EQ(d.last.body["bytes"], size);
  EXPECT_TRUE(d.out == payload);
}

TEST(MuxTest, WriteFromPipeSendsWhatThePipeHoldsByteExact) {
  // More than one frame's worth, and past the first window, from a real pipe.
  const size_t size = kInitialWindow + 3 * kMaxDataChunk + 777;
  std::string payload(size, '\0');
  for (size_t i = 0; i < size; ++i) payload[i] = static_cast<char>((i * 2654435761u) >> 11);
  auto p = MakePair([&](std::shared_ptr<Stream> s, Json) {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    UniqueFd r(fds[0]), w(fds[1]);
    size_t sent = 0;
    while (sent < size) {
      // At most the pipe's default capacity at a time, so the write never blocks.
      size_t n = std::min<size_t>(64 * 1024, size - sent);
      ASSERT_TRUE(WriteFull(w.get(), payload.data() + sent, n).ok());
      ASSERT_TRUE(s->WriteFromPipe(kChanOut, r.get(), n).ok());
      sent += n;
    }
    (void)s->CloseWrite(kChanOut);
    (void)s->End({{"bytes", sent}});
  });
  auto s = p.host->Open({{"op", "pipe"}});
  ASSERT_TRUE(s.ok());
  auto d = Drain(**s);
  ASSERT_TRUE(d.status.ok()) << d.status.ToString();
  EXPECT_EQ(d.last.body["bytes"], size);
  EXPECT_TRUE(d.out == payload);
}

TEST(MuxTest, SlowStreamDoesNotBlockOthers) {
  auto p = MakePair([&](std::shared_ptr<Stream> s, Json req) {
    if (req["op"] == "flood") {
      // Fills its window and blocks: the consumer never reads it until released.
      (void)s->Write(kChanOut, std::string(2 * kInitialWindow, 'f'));
      (void)s->End({});
      return;
    }
    (void)s->End({{"pong", true}});
  });
  auto flood = p.host->Open({{"op", "flood"}});
  ASSERT_TRUE(flood.ok());
  for (int i = 0; i < 20; ++i) {
    auto s = p.host->Open({{"op", "ping"}});
    ASSERT_TRUE(s.ok());
    auto d = Drain(**s);
    ASSERT_TRUE(d.status.ok());
    EXPECT_EQ(d.last.body["pong"], true);
  }
  auto d = Drain(**flood);
  EXPECT_EQ(d.out.size(), 2 * kInitialWindow);
}

// A writer whose peer takes nothing fails after its stall limit instead of waiting for
// ever; a peer that takes the bytes slowly, within the limit each time, never trips it.
TEST(MuxTest, AWriteStallLimitEndsAWaitForCreditThatNeverComes) {
  std::promise<std::shared_ptr<Stream>> held;
  auto p = MakePair([&](std::shared_ptr<Stream> s, Json req) {
    if (req["op"] == "sink") {
      held.set_value(s);  // never read: no credit comes back
      return;
    }
    std::thread([s] {
      uint64_t got = 0;
      for (;;) {
        auto m = s->Next();
        if (!m.ok() || m->kind != Kind::kData) break;
        got += m->data.size();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      (void)s->End({{"got", got}});
    }).detach();
  });
  auto s = p.host->Open({{"op", "sink"}});
  ASSERT_TRUE(s.ok());
  auto guest_side = held.get_future().get();
  (*s)->SetWriteStallLimit(std::chrono::milliseconds(300));
  auto t0 = std::chrono::steady_clock::now();
  Status st = (*s)->Write(kChanIn, std::string(kInitialWindow + 1, 'x'));
  EXPECT_EQ(st.code(), Code::kDeadlineExceeded) << st.ToString();
  EXPECT_NE(st.message().find("took none of this stream's data"), std::string::npos);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(300));

  auto slow = p.host->Open({{"op", "slow"}});
  ASSERT_TRUE(slow.ok());
  (*slow)->SetWriteStallLimit(std::chrono::milliseconds(2000));
  const size_t size = 2 * kInitialWindow + 99;
  ASSERT_TRUE((*slow)->Write(kChanIn, std::string(size, 'y')).ok());
  ASSERT_TRUE((*slow)->CloseWrite(kChanIn).ok());
  auto d = Drain(**slow);
  ASSERT_TRUE(d.status.ok()) << d.status.ToString();
  EXPECT_EQ(d.last.body["got"], size);
}

TEST(MuxTest, PeerDeathFailsPendingStreams) {
  std::atomic<bool> opened{false};
  auto p = MakePair([&](std::shared_ptr<Stream> s, Json) {
    opened = true;
    (void)s->Next();  // waits until the connection dies
  });
  auto s = p.host->Open({{"op", "hang"}});
  ASSERT_TRUE(s.ok());
  while (!opened) std::this_thread::yield();
  p.guest->Shutdown();
  auto m = (*s)->Next();
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kUnavailable);
  EXPECT_NE(m.status().message().find("channel lost"), std::string::npos);
  EXPECT_FALSE(p.host->Open({{"op", "x"}}).ok());
}

TEST(MuxTest, FrameCutInHalfKillsConnectionWithReason) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  Mux host(UniqueFd(sv[0]), Role::kHost);
  std::promise<std::string> died;
  host.OnDeath([&](const std::string& why) { died.set_value(why); });
  host.Start();
  std::string wire = EncodeFrame({2, FrameType::kEvent, 0, R"({"type":"x"})"});
  ASSERT_EQ(::write(sv[1], wire.data(), 7), 7);
  ::close(sv[1]);
  std::string why = died.get_future().get();
  EXPECT_NE(why.find("mid-frame"), std::string::npos) << why;
}

TEST(MuxTest, BadLengthKillsConnectionWithReason) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  Mux host(UniqueFd(sv[0]), Role::kHost);
  std::promise<std::string> died;
  host.OnDeath([&](const std::string& why) { died.set_value(why); });
  host.Start();
  char hdr[kHeaderSize];
  EncodeHeader(2, FrameType::kData, 0, 0xffffffffu, hdr);
  ASSERT_EQ(::write(sv[1], hdr, kHeaderSize), static_cast<ssize_t>(kHeaderSize));
  std::string why = died.get_future().get();
  EXPECT_NE(why.find("exceeds the limit"), std::string::npos) << why;
  ::close(sv[1]);
}

TEST(MuxTest, HandlerlessEndRefusesOpens) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  Mux a(UniqueFd(sv[0]), Role::kHost), b(UniqueFd(sv[1]), Role::kGuest);
  a.Start();
  b.Start();
  auto s = a.Open({{"op", "x"}});
  ASSERT_TRUE(s.ok());
  auto m = (*s)->Next();
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->kind, Kind::kReset);
  EXPECT_EQ(m->body["reason"], "this end accepts no requests");
}

TEST(MuxTest, ControlEventsReachTheHandler) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  Mux a(UniqueFd(sv[0]), Role::kHost), b(UniqueFd(sv[1]), Role::kGuest);
  std::promise<Json> hello;
  a.OnControl([&](const Json& e) { hello.set_value(e); });
  a.Start();
  b.Start();
  ASSERT_TRUE(b.SendControl({{"type", "hello"}}).ok());
  EXPECT_EQ(hello.get_future().get()["type"], "hello");
}

// Frames a Mux sent, read by a raw peer until EOF.
std::vector<Frame> ReadAllFrames(int fd) {
  FrameDecoder decoder;
  char buf[4096];
  for (;;) {
    auto n = ReadSome(fd, buf, sizeof buf);
    if (!n.ok() || *n == 0) break;
    decoder.Feed(std::string_view(buf, *n));
  }
  std::vector<Frame> frames;
  for (auto f = decoder.Next(); f.ok(); f = decoder.Next()) frames.push_back(std::move(f).value());
  return frames;
}

// Bug: a responder that ENDed a stream and then dropped it sent a RESET ("stream abandoned
// by its owner") after its END, on every request.
TEST(MuxTest, ResponderDroppingAnEndedStreamSendsNoReset) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd raw(sv[0]);
  Mux guest(UniqueFd(sv[1]), Role::kGuest);
  std::mutex mu;
  std::condition_variable cv;
  std::shared_ptr<Stream> held;
  guest.OnOpen([&](std::shared_ptr<Stream> s, Json) {
    ASSERT_TRUE(s->End({{"ok", true}}).ok());
    std::lock_guard<std::mutex> lock(mu);
    held = s;  // the test drops the last reference, so it knows when ~Stream has run
    cv.notify_all();
  });
  guest.Start();
  ASSERT_TRUE(WriteFull(raw.get(), EncodeFrame({1, FrameType::kOpen, 0, R"({"op":"x"})"})).ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return held != nullptr; }));
  }
  // Wait for the handler thread to let go of its copies.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (held.use_count() > 1 && std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
  ASSERT_EQ(held.use_count(), 1);
  held.reset();
  guest.Shutdown();

  std::vector<Frame> frames = ReadAllFrames(raw.get());
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].type, FrameType::kEnd);
  EXPECT_EQ(frames[0].stream, 1u);
}

TEST(MuxTest, RequesterDroppingAnUnfinishedStreamResetsIt) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd raw(sv[0]);
  Mux host(UniqueFd(sv[1]), Role::kHost);
  host.Start();
  {
    auto s = host.Open({{"op", "x"}});
    ASSERT_TRUE(s.ok());
  }
  host.Shutdown();
  std::vector<Frame> frames = ReadAllFrames(raw.get());
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].type, FrameType::kOpen);
  EXPECT_EQ(frames[1].type, FrameType::kReset);
}

// A requester cancelling from another thread (the MCP server's notifications/cancelled) must
// not leave the thread reading the stream blocked forever.
TEST(MuxTest, ResetWakesNextBlockedOnAnotherThread) {
  std::promise<std::string> peer_saw;
  auto p = MakePair([&](std::shared_ptr<Stream> s, Json) {
    auto m = s->Next();  // no END from here: the requester resets first
    peer_saw.set_value(m.ok() && m->kind == Kind::kReset ? m->body.value("reason", "") : "?");
  });
  auto s = p.host->Open({{"op", "long"}});
  ASSERT_TRUE(s.ok());
  auto next = std::async(std::launch::async, [st = *s] { return st->Next().status(); });
  ASSERT_TRUE((*s)->Reset("cancelled").ok());
  Status st = next.get();
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.ToString();
  EXPECT_EQ(peer_saw.get_future().get(), "cancelled");
}

}  // namespace
}  // namespace trybox::channel
