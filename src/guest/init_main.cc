// trybox-init: the guest's PID 1. Boots the guest (guest/boot.h), then serves the control
// protocol (guest/server.h) until a shutdown request powers it off.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <exception>
#include <thread>

#include "guest/boot.h"
#include "guest/cgroup.h"
#include "guest/credentials.h"
#include "guest/reaper.h"
#include "guest/server.h"
#include "util/log.h"

int main() {
  if (::getpid() != 1) {
    std::fprintf(stderr, "trybox-init: must run as PID 1 (it mounts and powers off the machine)\n");
    return 2;
  }
  // First of all, before any child shares or copies this memory: no process without
  // CAP_SYS_PTRACE may ptrace PID 1, read /proc/1/mem or take its descriptors (the control
  // port) with pidfd_getfd. Commands never hold CAP_SYS_PTRACE (guest/credentials.h).
  if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
    std::perror("trybox-init: PR_SET_DUMPABLE; powering off");
    trybox::guest::PowerOff();
  }
  // Also before any thread: every thread and child inherits the reduced bounding set.
  if (int e = trybox::guest::LimitBoundingSetForChildren()) {
    errno = e;
    std::perror("trybox-init: capability bounding set; powering off");
    trybox::guest::PowerOff();
  }
  // Before any thread exists, so that every thread inherits it: the reaper alone collects
  // SIGCHLD, with sigwaitinfo.
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  // SIGIO tells the server that the host side of the control port changed; it takes it
  // with sigtimedwait (guest/server.h).
  sigaddset(&chld, SIGIO);
  ::sigprocmask(SIG_BLOCK, &chld, nullptr);
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU}) {
    ::signal(sig, SIG_IGN);
  }
  ::umask(022);
  // PID 1 exiting panics the kernel; a clean power-off with a reason is kinder to the host.
  std::set_terminate([] {
    trybox::LogError("init", "fatal: uncaught exception; powering off");
    trybox::guest::PowerOff();
  });

  trybox::guest::BootInfo boot = trybox::guest::Boot();
  trybox::guest::Reaper reaper;
  reaper.Start();
  // Off the boot path: the host's first request need not wait for it.
  std::thread([] { trybox::guest::PrewarmExecCgroups(4); }).detach();
  trybox::guest::Server server(reaper, std::move(boot));
  server.Run();
}
