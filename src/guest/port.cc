#include "guest/port.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>

namespace trybox::guest {
namespace {

// The driver hands the host's bytes to readers one PAGE_SIZE buffer per read(2), and stops a
// readv at the first short segment; page-sized segments collect many buffers per call.
constexpr size_t kInSegment = 4096;
constexpr size_t kInSegments = 64;
// The driver takes at most 32 KiB per write(2); writev loops over segments of that size.
constexpr size_t kOutSegment = 32 * 1024;
constexpr size_t kOutBuffer = 1 << 20;

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
  r->out_ = std::thread([p = r.get()] { p->SocketToPort(); });
  return r;
}

PortRelay::~PortRelay() {
  Stop("relay destroyed");
  if (in_.joinable()) in_.join();
  if (out_.joinable()) out_.join();
}

void PortRelay::Stop(const std::string& why) {
  if (stopped_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    why_ = why;
  }
  stop_.Signal();
  // Wakes the socket reader and any blocked socket writer; the Mux sees a closed peer.
  ::shutdown(socket_.get(), SHUT_RDWR);
  cv_.notify_all();
}

std::string PortRelay::Wait() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stopped_.load(); });
  }
  if (in_.joinable()) in_.join();
  if (out_.joinable()) out_.join();
  std::lock_guard<std::mutex> lock(mu_);
  return why_;
}

void PortRelay::Flush(int timeout_ms) {
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!stopped_ && std::chrono::steady_clock::now() < until) {
    int queued = 0;
    if (::ioctl(socket_.get(), FIONREAD, &queued) != 0) return;
    if (queued == 0 && pending_ == 0) return;
    ::usleep(2000);
  }
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

void PortRelay::SocketToPort() {
  std::unique_ptr<char[]> buf(new char[kOutBuffer]);
  for (;;) {
    auto got = ReadSome(socket_.get(), buf.get(), kOutBuffer);
    if (!got.ok() || *got == 0) return Stop("the mux closed its end");
    pending_ = *got;
    size_t done = 0;
    while (done < *got) {
      struct iovec iov[kOutBuffer / kOutSegment];
      int n = 0;
      for (size_t off = done; off < *got; off += kOutSegment) {
        iov[n++] = {buf.get() + off, std::min(kOutSegment, *got - off)};
      }
      ssize_t w = ::writev(port_, iov, n);
      if (w > 0) {
        done += static_cast<size_t>(w);
        pending_ = *got - done;
        continue;
      }
      if (w < 0 && errno != EAGAIN && errno != EINTR) {
        return Stop(ErrnoError("write to port").message());
      }
      struct pollfd fds[2] = {{port_, POLLOUT, 0}, {stop_.fd_for_poll(), POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0 && errno != EINTR) {
        return Stop(ErrnoError("poll port").message());
      }
      if (stopped_) return;
      // No host: the driver would block the write until the next one connects, and the
      // rest of this frame would start that connection. Drop it instead.
      if ((fds[0].revents & POLLHUP) && !(fds[0].revents & POLLOUT)) {
        return Stop("host disconnected");
      }
    }
    pending_ = 0;
  }
}

}  // namespace trybox::guest
