#include "guest/port.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>

namespace trybox::guest {
namespace {

// The driver hands the host's bytes to readers one PAGE_SIZE buffer per read(2), and stops a
// readv at the first short segment; page-sized segments collect many buffers per call.
constexpr size_t kInSegment = 4096;
constexpr size_t kInSegments = 64;
// The driver takes at most 32 KiB per write(2); writev loops over segments of that size.
constexpr size_t kOutSegment = 32 * 1024;
constexpr size_t kOutSegments = 32;
// Bytes handed to the driver per splice(2): one virtqueue buffer of up to 64 pages, where a
// write(2) takes at most 32 KiB.
constexpr size_t kOutSplice = 256 * 1024;

}  // namespace

Result<std::string> FindVirtioPort(const std::string& name) {
  const std::string root = "/sys/class/virtio-ports";
  DIR* d = ::opendir(root.c_str());
  if (d == nullptr) return ErrnoError("open " + root);
  std::string found;
  while (struct dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    auto n = ReadFileToString(root + "/" + e->d_name + "/name");
    if (!n.ok()) continue;
    std::string port_name = *n;
    while (!port_name.empty() && (port_name.back() == '\n' || port_name.back() == ' ')) {
      port_name.pop_back();
    }
    if (port_name == name) {
      found = std::string("/dev/") + e->d_name;
      break;
    }
  }
  ::closedir(d);
  if (found.empty()) return NotFound("no virtio-serial port named " + name);
  return found;
}

Result<UniqueFd> OpenPortAndHideIt(const std::string& name) {
  ASSIGN_OR_RETURN(std::string path, FindVirtioPort(name));
  UniqueFd port(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK));
  if (!port.valid()) return ErrnoError("open " + path);
  if (::unlink(path.c_str()) != 0) return ErrnoError("unlink " + path);
  return port;
}

void DiscardPending(int port_fd) {
  char buf[4096];
  while (::read(port_fd, buf, sizeof buf) > 0) {
  }
}

bool HostConnected(int port_fd) {
  struct pollfd p = {port_fd, POLLIN | POLLOUT, 0};
  if (::poll(&p, 1, 0) < 0) return false;
  return (p.revents & POLLHUP) == 0;
}

Result<std::unique_ptr<PortRelay>> PortRelay::Start(int port, UniqueFd socket) {
  ASSIGN_OR_RETURN(Wakeup stop, Wakeup::Make());
  std::unique_ptr<PortRelay> r(new PortRelay(port, std::move(socket), std::move(stop)));
  r->in_ = std::thread([p = r.get()] { p->PortToSocket(); });
  return r;
}

PortRelay::~PortRelay() {
  Stop("relay destroyed");
  if (in_.joinable()) in_.join();
}

void PortRelay::Stop(const std::string& why) {
  if (stopped_.exchange(true)) return;
  {
    MutexLock lock(mu_);
    why_ = why;
  }
  stop_.Signal();
  // Wakes the Mux's reader, and a socket write blocked here; the Mux sees a closed peer.
  ::shutdown(socket_.get(), SHUT_RDWR);
  cv_.SignalAll();
}

std::string PortRelay::Wait() {
  {
    MutexLock lock(mu_);
    while (!stopped_.load()) cv_.Wait(mu_);
  }
  if (in_.joinable()) in_.join();
  MutexLock lock(mu_);
  return why_;
}

void PortRelay::PortToSocket() {
  std::unique_ptr<char[]> buf(new char[kInSegment * kInSegments]);
  struct iovec iov[kInSegments];
  for (size_t i = 0; i < kInSegments; ++i) iov[i] = {buf.get() + i * kInSegment, kInSegment};
  for (;;) {
    struct pollfd fds[2] = {{port_, POLLIN, 0}, {stop_.fd_for_poll(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) return Stop(ErrnoError("poll port").message());
    if (stopped_) return;
    ssize_t n = ::readv(port_, iov, kInSegments);
    if (n > 0) {
      if (!WriteFull(socket_.get(), buf.get(), static_cast<size_t>(n)).ok()) {
        return Stop("the mux closed its end");
      }
      continue;
    }
    if (n == 0) return Stop("host disconnected");
    if (errno == EAGAIN || errno == EINTR) continue;
    return Stop(ErrnoError("read from port").message());
  }
}

Status PortRelay::Live() const {
  // A session that stopped for any reason writes nothing more, even to a host still there.
  return stopped_ ? Unavailable("the session is over") : Status::Ok();
}

Status PortRelay::AwaitPortWritable() {
  struct pollfd fds[2] = {{port_, POLLOUT, 0}, {stop_.fd_for_poll(), POLLIN, 0}};
  if (::poll(fds, 2, -1) < 0 && errno != EINTR) {
    Status st = ErrnoError("poll port");
    Stop(st.message());
    return st;
  }
  RETURN_IF_ERROR(Live());
  // No host: the driver would block the write until the next one connects, and the rest of
  // this frame would start that connection. The frame is dropped instead.
  if ((fds[0].revents & POLLHUP) && !(fds[0].revents & POLLOUT)) {
    Stop("host disconnected");
    return Unavailable("host disconnected");
  }
  return Status::Ok();
}

class PortRelay::PortWriter : public channel::FrameWriter {
 public:
  explicit PortWriter(PortRelay& relay) : relay_(relay) {}

  // A write that failed cut its frame: the session writes nothing more (Stop), whatever
  // the reason.
  Status Write(struct iovec* iov, int count) override { return Ending(WriteAll(iov, count)); }

  Status Splice(int pipe, size_t len) override {
    // The driver (6.1) sizes the buffer it queues by the pages the pipe holds and lists that
    // many entries to the device, so a splice that leaves pages in the pipe hands QEMU empty
    // ones ('virtio: zero sized buffers are not allowed'), which breaks the virtqueue for
    // good: the guest's channel goes silent, and the host waits on it. So the bytes go
    // through a pipe of our own (moved, not copied) that must hold exactly what the port is
    // to take. That pipe exists only during this call: a process that can take init's
    // descriptors (a privileged VM's, with pidfd_getfd) once put its own bytes in a staging
    // pipe kept between frames, and the next frame left them behind in it (HostileE2E). And
    // a pipe that holds more than was staged is not spliced: the session ends instead.
    return Ending(SpliceStaged(pipe, len));
  }

 private:
  Status Ending(Status st) {
    if (!st.ok()) relay_.Stop("port writer: " + st.message());
    return st;
  }

  Status WriteAll(struct iovec* iov, int count) {
    // Each write(2) is a buffer the host is notified of, and under emulation each such
    // round costs more than copying a small frame: a frame that fits one write goes as one.
    size_t total = 0;
    for (int i = 0; i < count; ++i) total += iov[i].iov_len;
    struct iovec whole[1];
    if (count > 1 && total <= kOutSegment) {
      size_t off = 0;
      for (int i = 0; i < count; ++i) {
        std::memcpy(small_ + off, iov[i].iov_base, iov[i].iov_len);
        off += iov[i].iov_len;
      }
      whole[0] = {small_, total};
      iov = whole;
      count = 1;
    }
    while (count > 0) {
      RETURN_IF_ERROR(relay_.Live());
      struct iovec seg[kOutSegments];
      int n = 0;
      for (int i = 0; i < count && n < static_cast<int>(kOutSegments); ++i) {
        char* base = static_cast<char*>(iov[i].iov_base);
        for (size_t off = 0; off < iov[i].iov_len && n < static_cast<int>(kOutSegments);
             off += kOutSegment) {
          seg[n++] = {base + off, std::min(kOutSegment, iov[i].iov_len - off)};
        }
      }
      ssize_t w = n == 0 ? 0 : ::writev(relay_.port_, seg, n);
      if (w >= 0) {
        channel::AdvanceIov(&iov, &count, static_cast<size_t>(w));
        continue;
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN) return ErrnoError("write to port");
      RETURN_IF_ERROR(relay_.AwaitPortWritable());
    }
    return Status::Ok();
  }

  Status SpliceStaged(int pipe, size_t len) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return channel::CopyFromPipe(*this, pipe, len);
    UniqueFd staging_r(p[0]), staging_w(p[1]);
    ::fcntl(staging_w.get(), F_SETPIPE_SZ, static_cast<int>(kOutSplice));
    while (len > 0) {
      size_t staged = 0;
      const size_t want = std::min(len, kOutSplice);
      while (staged < want) {
        ssize_t m = ::splice(pipe, nullptr, staging_w.get(), nullptr, want - staged, 0);
        if (m < 0 && errno == EINTR) continue;
        if (m <= 0)
          return m < 0 ? ErrnoError("splice to the staging pipe") : Internal("pipe empty");
        staged += static_cast<size_t>(m);
      }
      len -= staged;
      while (staged > 0) {
        RETURN_IF_ERROR(relay_.Live());
        int held = 0;
        if (::ioctl(staging_r.get(), FIONREAD, &held) != 0) {
          return ErrnoError("FIONREAD on the staging pipe");
        }
        if (static_cast<size_t>(held) != staged) {
          return Internal("the staging pipe holds " + std::to_string(held) + " bytes, not the " +
                          std::to_string(staged) + " staged: another process wrote to it");
        }
        ssize_t w =
            ::splice(staging_r.get(), nullptr, relay_.port_, nullptr, staged, SPLICE_F_NONBLOCK);
        if (w > 0) {
          staged -= static_cast<size_t>(w);
          continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EINVAL) {
          RETURN_IF_ERROR(channel::CopyFromPipe(*this, staging_r.get(), staged));
          break;
        }
        if (w < 0 && errno != EAGAIN) return ErrnoError("splice to port");
        RETURN_IF_ERROR(relay_.AwaitPortWritable());
      }
    }
    return Status::Ok();
  }

  PortRelay& relay_;
  char small_[kOutSegment];  // a small frame gathered into one write
};

std::unique_ptr<channel::FrameWriter> PortRelay::Writer() {
  return std::make_unique<PortWriter>(*this);
}

}  // namespace trybox::guest
