// The port verb's relay (guest_ops.h): one client stream, one guest `port` stream.
#include <thread>

#include "daemon/guest_ops.h"

namespace trybox::daemon {
namespace {

using Kind = channel::Stream::Message::Kind;

// Client -> guest: channel 0 and its EOF, until the relay is over (the client stream is then
// Interrupt()ed) or the client goes, which stops the guest's connection.
void ForwardClient(channel::Stream& client, channel::Stream& guest) {
  for (;;) {
    auto m = client.Next();
    if (!m.ok()) {
      if (m.status().code() != Code::kCancelled) (void)guest.Reset("the client disconnected");
      return;
    }
    if (m->kind == Kind::kData && m->channel == channel::kChanIn) {
      (void)guest.Write(channel::kChanIn, m->data);
    } else if (m->kind == Kind::kEof && m->channel == channel::kChanIn) {
      (void)guest.CloseWrite(channel::kChanIn);
    } else if (m->kind == Kind::kReset || m->kind == Kind::kEnd) {
      (void)guest.Reset("the client cancelled the request");
      return;
    }
  }
}

}  // namespace

void RelayPort(GuestChannel& guest, int port, channel::Stream& client) {
  auto opened = guest.Open({{"op", "port"}, {"port", port}});
  if (!opened.ok()) {
    (void)client.End(ErrorReply(GuestGone(guest, opened.status())));
    return;
  }
  channel::Stream& s = **opened;
  std::thread up([&] { ForwardClient(client, s); });
  std::optional<Json> end;
  Status failure;
  for (bool over = false; !over;) {
    auto m = s.Next();
    if (!m.ok()) {
      failure = m.status();
      break;
    }
    switch (m->kind) {
      case Kind::kData:
        if (m->channel != channel::kChanOut) {
          (void)s.Reset("output on an input channel");
          failure = Internal("the guest's reply was malformed: data on channel " +
                             std::to_string(m->channel));
          over = true;
        } else if (!client.Write(channel::kChanOut, m->data).ok()) {
          (void)s.Reset("the client disconnected");
          failure = Unavailable("the client disconnected");
          over = true;
        }
        break;
      case Kind::kEof:
        if (m->channel == channel::kChanOut) (void)client.CloseWrite(channel::kChanOut);
        break;
      case Kind::kEvent:
        break;
      case Kind::kEnd:
        end = m->body;
        over = true;
        break;
      case Kind::kReset:
        failure = GuestAborted(m->body);
        over = true;
        break;
    }
  }
  client.Interrupt();
  up.join();
  if (!end) {
    (void)client.End(ErrorReply(GuestGone(guest, failure)));
    return;
  }
  std::string kind;
  Status st = FileEndStatus(*end, &kind);
  if (!st.ok()) {
    (void)client.End(ErrorReply(st, kind));
    return;
  }
  auto in = IntIn(end->value("bytes_in", Json()), 0, INT64_MAX);
  auto out = IntIn(end->value("bytes_out", Json()), 0, INT64_MAX);
  if (!in || !out) {
    (void)client.End(
        ErrorReply(Internal("the guest's reply was malformed: no integer 'bytes_in'/'bytes_out'")));
    return;
  }
  (void)client.End({{"ok", true}, {"bytes_in", *in}, {"bytes_out", *out}});
}

}  // namespace trybox::daemon
