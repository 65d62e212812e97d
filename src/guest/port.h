// The guest end of the control channel: the virtio-serial port named org.trybox.ctl.
//
// trybox-init opens the port once, for the life of the guest, and unlinks its /dev node at
// once: with PID 1 non-dumpable and commands without CAP_SYS_PTRACE or CAP_MKNOD, no other
// process can hold the port (and the driver refuses a second open with EBUSY anyway).
//
// The port is one byte pipe that outlives host connections, and its kernel driver blocks a
// writer while no host is connected, then lets the write continue into the *next*
// connection. A Mux writing to the port directly could therefore leave a half-written
// frame for the next host, and its Shutdown cannot interrupt a blocked read. So the Mux
// runs on one end of a socketpair and a PortRelay copies between the other end and the
// port with non-blocking I/O: when the host goes away the relay drops whatever it holds
// and closes the socket, which the Mux sees as an ordinary connection loss.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "guest/wakeup.h"
#include "util/fd.h"
#include "util/status.h"
#include "util/thread_annotations.h"

namespace trybox::guest {

inline constexpr const char* kControlPortName = "org.trybox.ctl";

// /dev/vportNpM for the port whose sysfs name is `name` (there is no udev, so no
// /dev/virtio-ports/ symlinks). kNotFound until the port has appeared.
Result<std::string> FindVirtioPort(const std::string& name);

// Opens the port named `name` (O_RDWR|O_NONBLOCK|O_CLOEXEC) and unlinks its /dev node.
// kNotFound until the port has appeared. A node that cannot be unlinked is an error: the
// port is then closed again rather than left reachable.
Result<UniqueFd> OpenPortAndHideIt(const std::string& name);

// True if a host has the port open (the driver reports POLLHUP while none has).
bool HostConnected(int port_fd);

// Reads and drops what the port holds now (a non-blocking port). The driver keeps bytes a
// host sent and nobody read across that host's disconnect; a new session must not start
// with the tail of the last one's frames.
void DiscardPending(int port_fd);

// Copies port <-> socket on two threads until the host disconnects, the port fails, or the
// socket's other end (the Mux) closes. Borrows the port (it outlives every relay); owns the
// socket. Not copyable or movable.
class PortRelay {
 public:
  // `port` must be open O_RDWR|O_NONBLOCK and outlive the relay. Starts both threads.
  static Result<std::unique_ptr<PortRelay>> Start(int port, UniqueFd socket);
  ~PortRelay();
  PortRelay(const PortRelay&) = delete;
  PortRelay& operator=(const PortRelay&) = delete;

  // Blocks until the relay has stopped for any reason; returns why.
  std::string Wait();
  // Stops both directions; pending bytes are dropped. Idempotent.
  void Stop(const std::string& why);
  // Waits (bounded) until every byte the Mux wrote has been handed to the port. For the
  // reply to a shutdown, which must leave before the power goes.
  void Flush(int timeout_ms);

 private:
  PortRelay(int port, UniqueFd socket, Wakeup stop)
      : port_(port), socket_(std::move(socket)), stop_(std::move(stop)) {}
  void PortToSocket();
  void SocketToPort();

  const int port_;
  UniqueFd socket_;
  Wakeup stop_;
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> pending_{0};  // read from the socket, not yet written to the port
  std::mutex mu_;
  std::condition_variable cv_;
  std::string why_ GUARDED_BY(mu_);
  std::thread in_, out_;
};

}  // namespace trybox::guest
