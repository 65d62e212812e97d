#include "daemon/heartbeat.h"

#include <cstdlib>

#include "util/log.h"

namespace trybox::daemon {
namespace {

using Condition = VmEntry::Condition;
using Clock = std::chrono::steady_clock;

// QMP gets this long to answer; a stopped QEMU answers nothing.
constexpr std::chrono::seconds kQmpDeadline{2};
// The guest gets this long to set its clock.
constexpr std::chrono::seconds kClockDeadline{5};
// A step this large (1 s) is logged.
constexpr int64_t kLogStepNs = 1000000000;

std::string Seconds(std::chrono::milliseconds ms) {
  return std::to_string(ms.count() / 1000) + " s";
}

}  // namespace

std::optional<Condition> NextCondition(Condition now, const HeartbeatLook& look,
                                       std::chrono::milliseconds timeout) {
  Condition next = now;
  if (look.ping_in_flight && look.waited >= timeout) {
    next = look.qemu_state == "io-error" ? Condition::kPaused : Condition::kUnresponsive;
  } else if (!look.ping_in_flight && look.last_ping_answered) {
    next = Condition::kRunning;
  }
  if (next == now) return std::nullopt;
  return next;
}

Heartbeat::Heartbeat(VmRegistry& registry, OnChange on_change, Options options)
    : registry_(registry), on_change_(std::move(on_change)), options_(options) {}

Heartbeat::~Heartbeat() { Stop(); }

void Heartbeat::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Heartbeat::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

void Heartbeat::Loop() {
  for (;;) {
    {
      MutexLock lock(mu_);
      const auto until = Clock::now() + options_.period;
      while (!stopping_ && wake_.WaitUntil(mu_, until)) {
      }
      if (stopping_) return;
    }
    std::map<std::string, std::shared_ptr<Slot>> seen;
    for (const auto& vm : registry_.All()) {
      auto& slot = slots_[vm->id()];
      if (!slot) slot = std::make_shared<Slot>();
      seen[vm->id()] = slot;
      if (vm->alive()) Look(vm, slot);
    }
    slots_ = std::move(seen);  // VMs gone from the registry are forgotten
  }
}

void Heartbeat::Look(const std::shared_ptr<VmEntry>& vm, const std::shared_ptr<Slot>& slot) {
  HeartbeatLook look;
  {
    MutexLock lock(slot->mu);
    look.ping_in_flight = slot->in_flight;
    look.last_ping_answered = slot->answered;
    if (slot->in_flight) {
      look.waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - slot->sent);
    }
  }
  if (look.ping_in_flight && look.waited >= options_.timeout) {
    auto state = vm->vm().RunState(Clock::now() + kQmpDeadline);
    look.qemu_state = state.ok() ? *state : "";
  }
  const Condition now = vm->condition();
  if (auto next = NextCondition(now, look, options_.timeout)) {
    std::string note;
    if (*next == Condition::kPaused) {
      note =
          "QEMU paused the VM on a disk I/O error (io-error: is the host's disk full?); it "
          "is resumed when its file system has room again";
    } else if (*next == Condition::kUnresponsive) {
      note = "its guest has not answered the host's heartbeat for " + Seconds(look.waited) +
             " (QEMU: " + (look.qemu_state.empty() ? "no answer" : look.qemu_state) + ")";
    }
    on_change_(*vm, *next, note);
  }
  if (vm->condition() == Condition::kPaused && look.qemu_state == "io-error") {
    auto free = vm->HostFreeBytes();
    if (free && *free >= options_.resume_free_bytes) {
      Status st = vm->vm().Resume(Clock::now() + kQmpDeadline);
      {
        MutexLock lock(slot->mu);
        slot->clock_due = true;  // it stood still while paused
      }
      LogInfo("heartbeat", "VM " + vm->id() + ": its file system has room again (" +
                               std::to_string(*free >> 20) +
                               " MiB free); resumed: " + (st.ok() ? "ok" : st.message()));
    }
  }
  if (on_damage_ && vm->damage().empty() &&
      (++slot->looks % options_.writes_every == 0 ||
       vm->HostFreeBytes().value_or(0) < options_.low_free_bytes)) {
    auto failed = vm->vm().FailedHostWrites(Clock::now() + kQmpDeadline);
    if (failed.ok() && *failed > 0) on_damage_(*vm, *failed);
  }
  if (look.ping_in_flight) return;
  {
    MutexLock lock(slot->mu);
    slot->in_flight = true;
    slot->sent = Clock::now();
  }
  std::thread(Ping, vm, slot, options_.clock_every).detach();
}

void Heartbeat::Ping(std::shared_ptr<VmEntry> vm, std::shared_ptr<Slot> slot, int clock_every) {
  bool answered = false;
  // Straight to the VM, not through the entry: the heartbeat's own stream is never among
  // those interrupted when the guest is declared unresponsive.
  auto s = vm->vm().Open({{"op", "ping"}});
  if (s.ok()) {
    auto m = (*s)->Next();
    answered = m.ok() && m->kind == channel::Stream::Message::Kind::kEnd && m->body.is_object() &&
               m->body.value("ok", Json(false)) == Json(true);
  }
  bool step = false;
  {
    MutexLock lock(slot->mu);
    if (!answered) {
      slot->clock_due = true;
    } else if (clock_every > 0 &&
               (slot->clock_due || ++slot->answered_since_clock >= clock_every)) {
      step = true;
    }
  }
  // Still in flight while the clock is set: the watch sends no second ping meanwhile, and a
  // guest that stops answering here is seen as one that stopped answering the ping.
  if (step) {
    auto offset = vm->vm().StepClock(Clock::now() + kClockDeadline);
    if (offset.ok() && (*offset >= kLogStepNs || *offset <= -kLogStepNs)) {
      LogInfo("heartbeat", "VM " + vm->id() + ": its clock was " +
                               std::to_string(std::llabs(*offset) / 1000000) + " ms " +
                               (*offset > 0 ? "behind" : "ahead of") +
                               " the host's; set to the host's");
    } else if (!offset.ok() && vm->alive()) {
      LogWarn("heartbeat",
              "VM " + vm->id() + ": could not set its clock: " + offset.status().message());
    }
    MutexLock lock(slot->mu);
    if (offset.ok()) {
      slot->clock_due = false;
      slot->answered_since_clock = 0;
    }
  }
  MutexLock lock(slot->mu);
  slot->in_flight = false;
  slot->answered = answered;
}

}  // namespace trybox::daemon
