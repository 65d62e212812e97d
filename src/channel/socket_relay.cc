#include "channel/socket_relay.h"

#include <sys/socket.h>

#include <mutex>
#include <string>
#include <thread>

#include "util/fd.h"

namespace trybox::channel {
namespace {

using Kind = Stream::Message::Kind;
constexpr size_t kChunk = 256 * 1024;  // one DATA frame at most

}  // namespace

SocketRelayResult RelaySocket(Stream& s, int sock, RelaySide side) {
  const bool responder = side == RelaySide::kResponder;
  const uint8_t out = responder ? kChanOut : kChanIn;  // socket bytes go out on this channel
  const uint8_t in = responder ? kChanIn : kChanOut;   // and this one comes to the socket
  SocketRelayResult r;
  std::mutex mu;
  bool socket_done = false;  // the socket's side is over (EOF forwarded, or failed)
  bool stream_eof = false;   // the peer's EOF on `in` arrived

  std::thread up([&] {
    std::string buf(kChunk, '\0');
    Status failure;
    for (;;) {
      auto n = ReadSome(sock, buf.data(), buf.size());
      if (!n.ok()) {
        failure = n.status();
        break;
      }
      if (*n == 0) {
        (void)s.CloseWrite(out);
        break;
      }
      if (!s.Write(out, std::string_view(buf.data(), *n)).ok()) break;  // the stream is over
      r.from_socket += static_cast<int64_t>(*n);
    }
    std::lock_guard<std::mutex> lock(mu);
    socket_done = true;
    r.socket_failure = failure;
    if (!failure.ok() && !responder) {
      (void)s.Reset("the connection failed: " + failure.message());
    } else if (!failure.ok() || stream_eof) {
      s.Interrupt();  // wakes the stream reader below: the relay is over
    }
  });

  bool writable = true;
  for (bool over = false; !over;) {
    auto m = s.Next();
    if (!m.ok()) {
      if (m.status().code() != Code::kCancelled) r.stream_failure = m.status();
      break;
    }
    switch (m->kind) {
      case Kind::kData:
        if (m->channel != in || !writable) break;
        // A socket whose reader has gone drops the rest, and the relay goes on for the
        // other direction.
        if (WriteFull(sock, m->data).ok()) {
          r.to_socket += static_cast<int64_t>(m->data.size());
        } else {
          writable = false;
        }
        break;
      case Kind::kEof:
        if (m->channel != in) break;
        ::shutdown(sock, SHUT_WR);
        {
          std::lock_guard<std::mutex> lock(mu);
          stream_eof = true;
          over = responder && socket_done;
        }
        break;
      case Kind::kEvent:
        break;
      case Kind::kEnd:
        r.end = m->body;
        over = true;
        break;
      case Kind::kReset:
        r.stream_failure = Unavailable(
            "the peer reset the stream: " +
            (m->body.is_object() && m->body.contains("reason") && m->body["reason"].is_string()
                 ? m->body["reason"].get<std::string>()
                 : std::string("no reason given")));
        over = true;
        break;
    }
  }
  // The socket reader may still be blocked (the relay ended early, or our peer is done
  // before the socket's client): this unblocks it, keeping what was written for delivery.
  ::shutdown(sock, SHUT_RDWR);
  up.join();
  return r;
}

}  // namespace trybox::channel
