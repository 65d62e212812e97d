// The guest end of the control channel: the virtio-serial port named org.trybox.ctl.
//
// trybox-init opens the port once, for the life of the guest, and unlinks its /dev node at
// once: with PID 1 non-dumpable and commands without CAP_SYS_PTRACE or CAP_MKNOD, no other
// process can hold the port (and the driver refuses a second open with EBUSY anyway).
//
// The port is one byte pipe that outlives host connections, and its kernel driver blocks a
// writer while no host is connected, then lets the write continue into the *next*
// connection. A Mux writing to the port with blocking writes could therefore leave a
// half-written frame for the next host, and its Shutdown cannot interrupt a blocked read.
// So the Mux reads one end of a socketpair, which a PortRelay fills from the port, and
// writes to the port with non-blocking writes that give up when the host goes away; the
// relay then closes the socket, which the Mux sees as an ordinary connection loss. (Its
// writes go to the port directly, not through the socketpair, because under emulation
// each copy of a byte costs about as much as the port itself: see docs/performance.md.)
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "channel/mux.h"
#include "guest/wakeup.h"
#include "util/fd.h"
#include "util/mutex.h"
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

// One host session on the port. The host's bytes go port -> socket on the relay's thread,
// for a Mux reading the socket's other end; the Mux writes its frames straight to the port
// through Writer(), which never blocks on a missing host: a write that finds the host gone
// (or the relay stopped) fails, and the Mux, its frame cut, writes nothing more. The relay
// stops when the host disconnects, the port fails, or the socket's other end (the Mux)
// closes. Borrows the port (it outlives every relay); owns the socket. Not copyable or
// movable.
class PortRelay {
 public:
  // `port` must be open O_RDWR|O_NONBLOCK and outlive the relay. Starts the thread.
  static Result<std::unique_ptr<PortRelay>> Start(int port, UniqueFd socket);
  ~PortRelay();
  PortRelay(const PortRelay&) = delete;
  PortRelay& operator=(const PortRelay&) = delete;

  // Blocks until the relay has stopped for any reason; returns why.
  std::string Wait();
  // Stops the relay; bytes not yet handed over are dropped. Idempotent.
  void Stop(const std::string& why);
  // Writes frames to the port: whole iovecs in segments the driver takes (32 KiB), and pipe
  // contents by splice(2), the driver taking the pipe's pages as they are. Borrows the
  // relay: used only while it lives (the Mux stops writing once the session is shut down).
  std::unique_ptr<channel::FrameWriter> Writer();

 private:
  class PortWriter;
  PortRelay(int port, UniqueFd socket, Wakeup stop)
      : port_(port), socket_(std::move(socket)), stop_(std::move(stop)) {}
  void PortToSocket();
  // Waits until the port takes more; an error if the host left or the relay stopped.
  Status AwaitPortWritable();
  // kUnavailable once the relay has stopped.
  Status Live() const;

  const int port_;
  UniqueFd socket_;
  Wakeup stop_;
  std::atomic<bool> stopped_{false};
  Mutex mu_;
  CondVar cv_;
  std::string why_ GUARDED_BY(mu_);
  std::thread in_;
};

}  // namespace trybox::guest
