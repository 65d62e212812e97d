// Heartbeat: the host's own watch on every running VM's guest (docs/reliability.md).
//
// Every `period` one thread looks at each VM in the registry. A VM with no ping in flight is
// sent one (OPEN {"op":"ping"} on its channel, docs/protocol/channel.md, "Heartbeat") on a
// short-lived thread of its own: a stopped QEMU reads nothing, so even the write of the
// OPEN may wait, and it must never hold up the watch. A ping unanswered after `timeout`
// makes the VM unresponsive, or paused when QEMU says it stopped the VM on a disk error
// (QMP query-status "io-error"). A paused VM is resumed (QMP cont) once its disk's file
// system has room again. A VM whose ping is answered again is running again. Each change
// goes to `on_change` (VmService::NoteCondition), which records and logs it.
//
// It also asks QEMU how many of the VM's writes failed on the host (Vm::FailedHostWrites):
// at every look while the file system of the VM's directory is nearly full, else every
// `writes_every` looks. A VM with any goes once to `on_damage` (VmService::NoteDamage): its
// guest saw I/O errors that came from the host's disk.
//
// Nothing here is on an exec's path: execs never wait for the heartbeat, which only wakes
// their streams when it gives up on a guest (VmEntry::SetCondition).
//
// Thread-safe. Stop() joins the watch; ping threads still waiting on a stopped guest hold
// only their VM entry and their own slot, and end when the VM is destroyed.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "daemon/vm_registry.h"
#include "util/mutex.h"

namespace trybox::daemon {

// The verdict of one look at a VM: what its condition becomes (nullopt: unchanged).
struct HeartbeatLook {
  bool ping_in_flight = false;
  bool last_ping_answered = false;     // the last ping that ended was answered
  std::chrono::milliseconds waited{};  // how long the ping in flight has waited
  std::string qemu_state;              // QMP query-status, asked only past the timeout
};
// Pure: the condition a VM in `now` should be in after `look`, or nullopt to keep `now`.
std::optional<VmEntry::Condition> NextCondition(VmEntry::Condition now, const HeartbeatLook& look,
                                                std::chrono::milliseconds timeout);

class Heartbeat {
 public:
  using OnChange = std::function<void(VmEntry&, VmEntry::Condition, const std::string& note)>;
  struct Options {
    std::chrono::milliseconds period{2000};
    std::chrono::milliseconds timeout{5000};
    // A paused VM is resumed only while its directory's file system has this much free.
    uint64_t resume_free_bytes = uint64_t{64} << 20;
    // Every this many answered pings the guest's clock is set to the host's (0: never).
    int clock_every = 5;
    // Failed host writes are asked at every look under this much free, else every
    // `writes_every` looks.
    uint64_t low_free_bytes = uint64_t{256} << 20;
    int writes_every = 15;
  };
  using OnDamage = std::function<void(VmEntry&, int64_t failed_writes)>;

  Heartbeat(VmRegistry& registry, OnChange on_change, Options options);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Before Start().
  void SetOnDamage(OnDamage on_damage) { on_damage_ = std::move(on_damage); }
  void Start();
  void Stop() EXCLUDES(mu_);

 private:
  // One VM's ping, shared with the thread that sends it.
  struct Slot {
    Mutex mu;
    bool in_flight GUARDED_BY(mu) = false;
    bool answered GUARDED_BY(mu) = true;
    std::chrono::steady_clock::time_point sent GUARDED_BY(mu);
    int answered_since_clock GUARDED_BY(mu) = 0;
    bool clock_due GUARDED_BY(mu) = false;  // after an unanswered ping or a resume
    int looks = 0;                          // the watch thread's own
  };
  void Loop() EXCLUDES(mu_);
  void Look(const std::shared_ptr<VmEntry>& vm, const std::shared_ptr<Slot>& slot);
  static void Ping(std::shared_ptr<VmEntry> vm, std::shared_ptr<Slot> slot, int clock_every);

  VmRegistry& registry_;
  const OnChange on_change_;
  OnDamage on_damage_;
  const Options options_;
  Mutex mu_;
  CondVar wake_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<Slot>> slots_;  // the watch thread's own
  std::thread thread_;
};

}  // namespace trybox::daemon
