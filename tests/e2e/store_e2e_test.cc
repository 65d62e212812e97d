// The guarded record, end to end (issue 19; docs/store.md): a daemon refuses a damaged
// store and names it; `trybox prune` removes each kind of leftover and never a live VM's;
// a full state filesystem refuses creates and execs by name, nothing runs unrecorded, and
// everything works again once space returns, without a restart.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/mount.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "store/store.h"
#include "tests/e2e/harness.h"
#include "util/fd.h"

namespace trybox::e2e {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// tryboxd run in the foreground on `home`: its exit code and what it printed.
CliResult RunDaemon(const std::string& home) {
  return RunProgram({BinDir() + "/tryboxd"},
                    {"TRYBOX_HOME=" + home, "PATH=" + std::string(std::getenv("PATH"))});
}

TEST(StoreE2E, ADaemonOnAnEmptyOrDamagedStoreRefusesToStartNamingTheFile) {
  auto dir = TempDir::Make("/tmp", "tbx-store-e2e-");
  ASSERT_TRUE(dir.ok());
  const std::string home = dir->path();
  const std::string db = home + "/state/trybox.db";
  ASSERT_TRUE(MakeDirs(home + "/state", 0700).ok());

  // 0 bytes: on main this started as a new, empty store, and old ids answered "no VM".
  ASSERT_TRUE(WriteFileAtomic(db, "", 0600).ok());
  CliResult r = RunDaemon(home);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find(db + " is empty (0 bytes)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("move it aside"), std::string::npos) << r.err;
  EXPECT_EQ(fs::file_size(db), 0u) << "the refused file was written to";
  // The CLI that starts the daemon says why it did not answer.
  CliResult cli = RunProgram({BinDir() + "/trybox", "ls"},
                             {"TRYBOX_HOME=" + home, "PATH=" + std::string(std::getenv("PATH"))});
  EXPECT_EQ(cli.code, 125);
  EXPECT_NE(cli.err.find(db + " is empty (0 bytes)"), std::string::npos) << cli.err;
  EXPECT_EQ(fs::file_size(db), 0u);

  // A real store with a damaged page: on main it was opened and written to.
  ASSERT_TRUE(RemoveTree(db).ok());
  {
    auto s = store::Store::Open(db);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    for (int i = 0; i < 200; ++i) {
      store::VmRecord v;
      v.id = "vm" + std::to_string(i);
      v.state = "destroyed";
      v.note = std::string(300, 'n');
      ASSERT_TRUE((*s)->InsertVm(v).ok());
    }
  }
  auto fd = OpenFile(db, O_RDWR);
  ASSERT_TRUE(fd.ok());
  std::string garbage(4096, '\xab');
  ASSERT_EQ(::pwrite(fd->get(), garbage.data(), garbage.size(), 4096), 4096);
  r = RunDaemon(home);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find(db + " is damaged"), std::string::npos) << r.err;

  // Another program's database.
  ASSERT_TRUE(RemoveTree(db).ok());
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "CREATE TABLE photos (id INTEGER)", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(other);
  r = RunDaemon(home);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find(db + " is not a trybox store"), std::string::npos) << r.err;
}

// Rows and directories a long life leaves, put where the daemon keeps them.
void PlantLeftovers(const std::string& state) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((state + "/trybox.db").c_str(), &db), SQLITE_OK);
  sqlite3_busy_timeout(db, 10000);
  const double old = store::NowSeconds() - 40 * 86400;  // past every default age
  const std::string o = std::to_string(old);
  const std::string sql =
      "INSERT INTO egress (vm_id, started_at, ended_at, method, host, port, address, verdict, "
      "reason, override, status) VALUES ('gonevm', " +
      o + ", " + o + ", 'CONNECT', 'a.test', 443, '', 'refused', 'x', 0, 0), ('gonevm', " + o +
      ", " + o +
      ", 'CONNECT', 'b.test', 443, '', 'refused', 'x', 0, 0); INSERT INTO agent_runs (id, "
      "created_at, updated_at, outcome, vm_id, state, transcript) VALUES ('oldrun', " +
      o + ", " + o +
      ", 'DONE', 'gonevm', '{}', '[]'), ('newrun', 1e10, 1e10, 'DONE', 'gonevm', '{}', '[]')";
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
      << sqlite3_errmsg(db);
  sqlite3_close(db);
  for (const char* d : {"/runs/oldrun/repo", "/runs/newrun/collected", "/collect/0123456789ab-x1",
                        "/execs/ba9876543210"}) {
    ASSERT_TRUE(MakeDirs(state + d, 0700).ok());
    ASSERT_TRUE(WriteFileAtomic(state + d + "/f", std::string(100000, 'f'), 0600).ok());
  }
}

TEST(StoreE2E, PruneRemovesEachKindOfLeftoverAndNeverALiveVms) {
  // One ended VM kept; pruning only by hand, so nothing happens between the two calls.
  auto h = Harness::Start({"TRYBOX_RETENTION_VMS=1", "TRYBOX_PRUNE_INTERVAL_S=0"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  const std::string state = (*h)->home() + "/state";
  std::string ids[3];
  for (auto& id : ids) {
    CliResult c = (*h)->Cli({"create"});
    ASSERT_EQ(c.code, 0) << c.err;
    id = FirstLine(c.out);
    CliResult e = (*h)->Cli({"exec", id, "--", "echo", "kept output"});
    ASSERT_EQ(e.code, 0) << e.err;
  }
  const std::string& live = ids[2];
  // The oldest ended VM goes (the count keeps one); the live one stays whatever its age.
  ASSERT_EQ((*h)->Cli({"rm", ids[0]}).code, 0);
  ASSERT_EQ((*h)->Cli({"rm", ids[1]}).code, 0);
  PlantLeftovers(state);

  CliResult dry = (*h)->Cli({"prune", "--dry-run", "--json"});
  ASSERT_EQ(dry.code, 0) << dry.err;
  json d = json::parse(dry.out);
  EXPECT_EQ(d["dry_run"], true);
  EXPECT_EQ(d["rows"]["vms"], 1) << dry.out;
  EXPECT_EQ(d["rows"]["execs"], 1) << dry.out;
  EXPECT_EQ(d["rows"]["egress"], 2) << dry.out;
  EXPECT_EQ(d["rows"]["agent_runs"], 1) << dry.out;
  EXPECT_EQ(d["dirs"]["exec_logs"], 1) << dry.out;  // the pruned VM's
  // The logs of a VM the store does not know are its only trace: moved aside, never deleted
  // (issue 51.18), so not counted in the bytes freed.
  EXPECT_EQ(d["dirs"]["exec_logs_moved_aside"], 1) << dry.out;
  EXPECT_EQ(d["dirs"]["run_dirs"], 1) << dry.out;
  EXPECT_EQ(d["dirs"]["collect_leftovers"], 2) << dry.out;
  EXPECT_GE(d["bytes"].get<int64_t>(), 300000) << dry.out;
  // Nothing removed by the dry run.
  EXPECT_TRUE(fs::exists(state + "/execs/" + ids[0]));
  EXPECT_TRUE(fs::exists(state + "/runs/oldrun"));
  EXPECT_EQ((*h)->Cli({"ps", ids[0]}).code, 0);

  CliResult real = (*h)->Cli({"prune"});
  ASSERT_EQ(real.code, 0) << real.err;
  EXPECT_NE(real.out.find("pruned:"), std::string::npos) << real.out;
  EXPECT_NE(real.out.find("VM records:    1 (1 execs"), std::string::npos) << real.out;
  EXPECT_NE(real.out.find("egress rows:   2"), std::string::npos) << real.out;
  EXPECT_FALSE(fs::exists(state + "/execs/" + ids[0]));
  EXPECT_FALSE(fs::exists(state + "/execs/ba9876543210"));
  EXPECT_TRUE(fs::exists(state + "/execs-unrecorded/ba9876543210/f"));
  EXPECT_FALSE(fs::exists(state + "/runs/oldrun"));
  EXPECT_FALSE(fs::exists(state + "/runs/newrun/collected"));
  EXPECT_FALSE(fs::exists(state + "/collect/0123456789ab-x1"));
  EXPECT_TRUE(fs::exists(state + "/runs/newrun"));
  EXPECT_NE((*h)->Cli({"ps", ids[0]}).code, 0);
  // The newest ended VM and the live one keep their rows and their output.
  EXPECT_EQ((*h)->Cli({"ps", ids[1]}).code, 0);
  CliResult ps = (*h)->Cli({"ps", live});
  EXPECT_EQ(ps.code, 0) << ps.err;
  EXPECT_NE(ps.out.find("echo"), std::string::npos) << ps.out;
  // The WAL was checkpointed.
  EXPECT_EQ(fs::file_size(state + "/trybox.db-wal"), 0u);

  CliResult again = (*h)->Cli({"prune", "--json"});
  ASSERT_EQ(again.code, 0) << again.err;
  json a = json::parse(again.out);
  EXPECT_EQ(a["rows"]["vms"], 0) << again.out;
  EXPECT_EQ(a["rows"]["egress"], 0) << again.out;
  EXPECT_EQ(a["dirs"]["collect_leftovers"], 0) << again.out;
  EXPECT_EQ((*h)->Cli({"exec", live, "--", "true"}).code, 0);
  (void)(*h)->Cli({"rm", live});
}

// The state directory on a small tmpfs of our own, unmounted however the test ends.
class FullDisk {
 public:
  explicit FullDisk(Harness& h) : h_(h), state_(h.home() + "/state") {}
  ~FullDisk() {
    (void)h_.StopDaemon();
    if (mounted_) (void)::umount2(state_.c_str(), MNT_DETACH);
  }
  Status Mount() {
    RETURN_IF_ERROR(h_.StopDaemon());
    if (::mount("tmpfs", state_.c_str(), "tmpfs", 0, "size=48m,mode=0700") != 0) {
      return ErrnoError("mount tmpfs on " + state_);
    }
    mounted_ = true;
    return h_.RestartDaemon();
  }
  // Writes a file until the filesystem is full.
  Status Fill() {
    ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(filler(), O_WRONLY | O_CREAT | O_TRUNC, 0600));
    std::string chunk(1 << 16, 'z');
    for (;;) {
      if (::write(fd.get(), chunk.data(), chunk.size()) < 0) {
        if (errno == ENOSPC) return Status::Ok();
        return ErrnoError("fill " + filler());
      }
    }
  }
  void Free() { (void)::unlink(filler().c_str()); }

 private:
  std::string filler() const { return state_ + "/filler"; }
  Harness& h_;
  const std::string state_;
  bool mounted_ = false;
};

TEST(StoreE2E, AFullStateFilesystemRefusesCreatesAndExecsUntilSpaceReturns) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  // Cold boots: no template (it would not fit on the small filesystem); no reserve, so the
  // store's own floor is what refuses.
  auto h =
      Harness::Start({"TRYBOX_SPARES=0", "TRYBOX_DISK_RESERVE_MIB=0", "TRYBOX_PRUNE_INTERVAL_S=0"});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  FullDisk disk(**h);
  ASSERT_TRUE(disk.Mount().ok());
  const pid_t daemon = (*h)->daemon_pid();
  CliResult c = (*h)->Cli({"create", "--cold"});
  ASSERT_EQ(c.code, 0) << c.err;
  const std::string vm = FirstLine(c.out);
  ASSERT_EQ((*h)->Cli({"exec", vm, "--", "true"}).code, 0);

  ASSERT_TRUE(disk.Fill().ok());
  // The exec is refused by name, and its command never ran.
  CliResult e = (*h)->Cli({"exec", vm, "--", "touch", "/root/ran"});
  EXPECT_EQ(e.code, 125) << e.out;
  EXPECT_NE(e.err.find("store_unavailable"), std::string::npos) << e.err;
  CliResult d = (*h)->Cli({"exec", vm, "-d", "--", "touch", "/root/ran"});
  EXPECT_EQ(d.code, 125) << d.out;
  EXPECT_NE(d.err.find("store_unavailable"), std::string::npos) << d.err;
  CliResult cr = (*h)->Cli({"create", "--cold"});
  EXPECT_EQ(cr.code, 125) << cr.out;
  EXPECT_NE(cr.err.find("store_unavailable"), std::string::npos) << cr.err;
  CliResult doctor = (*h)->Cli({"doctor"});
  EXPECT_NE(doctor.out.find("NO SPACE"), std::string::npos) << doctor.out;

  // Space returns: everything works again, same daemon.
  disk.Free();
  CliResult ran = (*h)->Cli({"exec", vm, "--", "test", "-e", "/root/ran"});
  EXPECT_EQ(ran.code, 1) << "a refused exec ran: " << ran.err;
  CliResult ps = (*h)->Cli({"ps", vm, "--json"});
  ASSERT_EQ(ps.code, 0) << ps.err;
  json rows = json::parse(ps.out);
  // true, then test -e: the refused ones left no row, and every row that ran is there.
  ASSERT_TRUE(rows.is_array()) << ps.out;
  EXPECT_EQ(rows.size(), 2u) << ps.out;
  CliResult c2 = (*h)->Cli({"create", "--cold"});
  EXPECT_EQ(c2.code, 0) << c2.err;
  EXPECT_EQ((*h)->daemon_pid(), daemon);
  doctor = (*h)->Cli({"doctor"});
  EXPECT_EQ(doctor.out.find("NO SPACE"), std::string::npos) << doctor.out;
  (void)(*h)->Cli({"rm", vm});
  if (c2.code == 0) (void)(*h)->Cli({"rm", FirstLine(c2.out)});
}

}  // namespace
}  // namespace trybox::e2e
