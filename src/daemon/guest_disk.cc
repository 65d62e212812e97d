#include "daemon/guest_disk.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

#include "util/log.h"

namespace trybox::daemon {
namespace {

using Kind = channel::Stream::Message::Kind;

// The guest sees whole sectors.
uint64_t Sectors(uint64_t bytes) { return (bytes + 511) / 512 * 512; }

// All of `d` at `offset`.
Status PWriteFull(int fd, std::string_view d, uint64_t offset) {
  while (!d.empty()) {
    ssize_t n = ::pwrite(fd, d.data(), d.size(), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoError("write the transfer disk");
    d.remove_prefix(static_cast<size_t>(n));
    offset += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

// Empties the disk when a transfer is over, however it ended (unless kept for a reader).
class EmptyAfter {
 public:
  explicit EmptyAfter(TransferDiskPort& port) : port_(port) {}
  ~EmptyAfter() {
    if (keep_) return;
    Status st = port_.Announce(0);
    if (!st.ok()) LogDebug("daemon", "empty the transfer disk: " + st.message());
  }
  void Keep() { keep_ = true; }

 private:
  TransferDiskPort& port_;
  bool keep_ = false;
};

}  // namespace

bool DiskRefused(const Json& end) {
  if (!end.is_object() || !end.contains("error") || !end["error"].is_string()) return false;
  const std::string e = end["error"];
  return e == "no_transfer_disk" || e == "disk_busy" || e == "disk_full";
}

DiskContent::DiskContent(TransferDiskPort& port, std::unique_lock<std::timed_mutex> lock,
                         uint64_t bytes, std::vector<Json> events, Json end)
    : port_(port),
      lock_(std::move(lock)),
      bytes_(bytes),
      events_(std::move(events)),
      end_(std::move(end)) {}

DiskContent::~DiskContent() {
  Status st = port_.Announce(0);
  if (!st.ok()) LogDebug("daemon", "empty the transfer disk: " + st.message());
}

Result<std::string> DiskContent::Read(size_t max) {
  size_t want = static_cast<size_t>(std::min<uint64_t>(max, bytes_ - read_));
  std::string out(want, '\0');
  size_t got = 0;
  while (got < want) {
    ssize_t n =
        ::pread(port_.fd_for_io(), out.data() + got, want - got, static_cast<off_t>(read_ + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("read the transfer disk");
    // The guest said it wrote more than the file holds: the rest is missing, not zeros.
    if (n == 0) return Internal("the transfer disk holds less than the guest reported");
    got += static_cast<size_t>(n);
  }
  read_ += got;
  return out;
}

Result<std::optional<Json>> PutViaDisk(GuestChannel& guest, Json greq, const ContentWriter& write) {
  const std::optional<Json> refused;
  TransferDiskPort* port = guest.transfer_disk();
  if (!port) return refused;
  std::unique_lock<std::timed_mutex> lock = port->TryLock();
  if (!lock) return refused;
  EmptyAfter empty(*port);
  // The disk is empty after every transfer; the announced size cuts whatever follows.
  uint64_t bytes = 0;
  bool host_full = false;
  Status st = write([&](std::string_view d) -> Status {
    Status w = PWriteFull(port->fd_for_io(), d, bytes);
    host_full = !w.ok();
    bytes += d.size();
    return w;
  });
  // The host's own disk could not take it: the channel needs no room here.
  if (host_full) {
    LogInfo("daemon", "the transfer disk's file could not take the content; using the channel");
    return refused;
  }
  RETURN_IF_ERROR(st);
  if (Status a = port->Announce(Sectors(bytes)); !a.ok()) {
    if (!guest.alive()) return GuestGone(guest, a);
    return refused;
  }
  greq["disk"] = {{"bytes", bytes}};
  auto s = guest.Open(greq);
  if (!s.ok()) return GuestGone(guest, s.status());
  Status eof = (*s)->CloseWrite(channel::kChanIn);
  if (!eof.ok()) return GuestGone(guest, eof);
  auto end = AwaitEnd(**s);
  if (!end.ok()) return GuestGone(guest, end.status());
  if (DiskRefused(*end)) return refused;
  return std::optional<Json>(*end);
}

Result<std::unique_ptr<DiskContent>> GetViaDisk(GuestChannel& guest, Json greq,
                                                uint64_t max_bytes) {
  TransferDiskPort* port = guest.transfer_disk();
  if (!port) return std::unique_ptr<DiskContent>();
  std::unique_lock<std::timed_mutex> lock = port->TryLock();
  if (!lock) return std::unique_ptr<DiskContent>();
  EmptyAfter empty(*port);
  max_bytes = Sectors(max_bytes);
  if (Status a = port->Announce(max_bytes); !a.ok()) {
    if (!guest.alive()) return GuestGone(guest, a);
    return std::unique_ptr<DiskContent>();
  }
  greq["disk"] = {{"max_bytes", max_bytes}};
  auto s = guest.Open(greq);
  if (!s.ok()) return GuestGone(guest, s.status());
  std::vector<Json> events;
  Json end;
  for (;;) {
    auto m = (*s)->Next();
    if (!m.ok()) return GuestGone(guest, m.status());
    if (m->kind == Kind::kEvent) events.push_back(m->body);
    if (m->kind == Kind::kReset) return GuestGone(guest, GuestAborted(m->body));
    if (m->kind == Kind::kData) {
      (void)(*s)->Reset("data on the channel during a transfer through the disk");
      return Internal("the guest's reply was malformed: data on the channel for a disk get");
    }
    if (m->kind == Kind::kEnd) {
      end = m->body;
      break;
    }
  }
  if (DiskRefused(end)) return std::unique_ptr<DiskContent>();
  // How much the guest says it wrote; never more than the room it was given.
  uint64_t bytes = 0;
  if (end.is_object() && end.value("ok", false) == true) {
    bytes = static_cast<uint64_t>(IntIn(end.value("bytes", Json(0)), 0, INT64_MAX).value_or(0));
    bytes = std::min(bytes, max_bytes);
  }
  empty.Keep();  // DiskContent empties it when dropped
  return std::make_unique<DiskContent>(*port, std::move(lock), bytes, std::move(events),
                                       std::move(end));
}

bool RelayPutViaDisk(GuestChannel& guest, const Json& greq, channel::Stream& client,
                     const Spooled& head) {
  TransferDiskPort* port = guest.transfer_disk();
  if (!port) return false;
  std::unique_lock<std::timed_mutex> lock = port->TryLock();
  if (!lock) return false;
  EmptyAfter empty(*port);
  // The upload goes to the file as it arrives. Should the host's disk fill up, what could
  // not be written is kept, and the rest of the put takes the channel.
  Spooled spooled;
  spooled.fd = port->fd_for_io();
  spooled.upload_ended = head.upload_ended;
  bool host_full = false;
  auto spool = [&](std::string_view d) {
    while (!d.empty() && !host_full) {
      ssize_t n = ::pwrite(spooled.fd, d.data(), d.size(), static_cast<off_t>(spooled.bytes));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        host_full = true;
        spooled.tail = std::string(d);
        break;
      }
      d.remove_prefix(static_cast<size_t>(n));
      spooled.bytes += static_cast<uint64_t>(n);
    }
  };
  spool(head.tail);
  while (!host_full && !spooled.upload_ended) {
    auto m = client.Next();
    if (!m.ok() || m->kind == Kind::kReset || m->kind == Kind::kEnd) return true;  // gone
    if (m->kind == Kind::kEof) spooled.upload_ended = true;
    if (m->kind == Kind::kData) spool(m->data);
  }
  if (!host_full) {
    if (Status a = port->Announce(Sectors(spooled.bytes)); !a.ok()) {
      if (!guest.alive()) {
        FinishRelay(guest, client, std::nullopt, a);
        return true;
      }
    } else {
      Json with_disk = greq;
      with_disk["disk"] = {{"bytes", spooled.bytes}};
      auto s = guest.Open(with_disk);
      if (!s.ok()) {
        FinishRelay(guest, client, std::nullopt, s.status());
        return true;
      }
      (void)(*s)->CloseWrite(channel::kChanIn);
      auto end = AwaitEnd(**s);
      if (!end.ok()) {
        FinishRelay(guest, client, std::nullopt, end.status());
        return true;
      }
      if (!DiskRefused(*end)) {
        FinishRelay(guest, client, *end, Status::Ok(), /*via_disk=*/true);
        return true;
      }
    }
  }
  LogInfo("daemon", "a put could not use the transfer disk part-way; using the channel");
  RelayPutChannel(guest, greq, client, &spooled);
  return true;
}

bool RelayGetViaDisk(GuestChannel& guest, const Json& greq, channel::Stream& client) {
  auto content = GetViaDisk(guest, greq, TarReader::kMaxDiskTransfer);
  if (!content.ok()) {
    FinishRelay(guest, client, std::nullopt, content.status());
    return true;
  }
  if (!*content) return false;
  DiskContent& c = **content;
  if (!FileEndStatus(c.end()).ok()) {
    FinishRelay(guest, client, c.end(), Status::Ok());
    return true;
  }
  for (const auto& e : c.events()) {
    auto ev = GuestMetaEvent(e);
    if (!ev.ok()) {
      (void)client.End(
          ErrorReply(Internal("the guest's reply was malformed: " + ev.status().message())));
      return true;
    }
    if (!ev->is_null()) (void)client.SendEvent(*ev);
  }
  for (;;) {
    auto chunk = c.Read(1 << 20);
    if (!chunk.ok()) {
      (void)client.End(ErrorReply(chunk.status()));
      return true;
    }
    if (chunk->empty()) break;
    if (!client.Write(channel::kChanOut, *chunk).ok()) return true;  // the client left
  }
  (void)client.CloseWrite(channel::kChanOut);
  FinishRelay(guest, client, c.end(), Status::Ok(), /*via_disk=*/true);
  return true;
}

}  // namespace trybox::daemon
