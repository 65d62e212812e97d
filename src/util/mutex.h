// Mutex, MutexLock and CondVar: std::mutex and std::condition_variable_any with the
// annotations clang's -Wthread-safety checks (util/thread_annotations.h), so that a member
// marked GUARDED_BY(mu_) read without mu_ held is a compile error in the clang build.
//
// Waits are written as loops over the condition (`while (!ready) cv.Wait(mu);`), which the
// analysis can follow; a predicate lambda would hide the guarded reads from it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "util/thread_annotations.h"

namespace trybox {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  // For a function that the analysis cannot follow into but that runs with the lock held.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

  // BasicLockable, for std::condition_variable_any only.
  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

// Holds a Mutex for its scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() RELEASE() { mu_.Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// A condition variable for Mutex. Every Wait is called with the mutex held and returns with
// it held; wake-ups may be spurious, so callers loop over their condition.
class CondVar {
 public:
  void Wait(Mutex& mu) REQUIRES(mu) { cv_.wait(mu); }
  // False once `deadline` has passed.
  bool WaitUntil(Mutex& mu, std::chrono::steady_clock::time_point deadline) REQUIRES(mu) {
    return cv_.wait_until(mu, deadline) == std::cv_status::no_timeout;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

}  // namespace trybox
