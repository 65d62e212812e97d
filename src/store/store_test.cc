#include "store/store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "store/schema.h"
#include "util/fd.h"

namespace trybox::store {
namespace {

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = TempDir::Make("/tmp", "store-test-");
    ASSERT_TRUE(d.ok());
    dir_.emplace(std::move(*d));
    auto s = Store::Open(dir_->path() + "/t.db");
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  std::optional<TempDir> dir_;
  std::unique_ptr<Store> store_;
};

VmRecord Vm(const std::string& id) {
  VmRecord v;
  v.id = id;
  v.image = "debian-12";
  v.image_sha256 = "ab";
  v.state = "running";
  v.pid = 42;
  v.accel = "tcg";
  v.memory_mib = 512;
  v.cpus = 1;
  v.dir = "/run/x";
  v.created_at = NowSeconds();
  return v;
}

TEST_F(StoreTest, VmLifecycleIsRecorded) {
  ASSERT_TRUE(store_->InsertVm(Vm("aaa")).ok());
  ASSERT_TRUE(store_->UpdateVmState("aaa", "destroyed", "{}").ok());
  auto got = store_->GetVm("aaa");
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->state, "destroyed");
  EXPECT_GT((*got)->ended_at, 0);
  EXPECT_EQ(store_->UpdateVmState("nope", "dead", "").code(), Code::kNotFound);
  auto none = store_->GetVm("nope");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

// Issue 41.5: whether a VM was created --privileged is part of its record.
TEST_F(StoreTest, PrivilegedIsRecordedAndReadBack) {
  VmRecord priv = Vm("priv");
  priv.privileged = true;
  ASSERT_TRUE(store_->InsertVm(priv).ok());
  ASSERT_TRUE(store_->InsertVm(Vm("plain")).ok());
  auto p = store_->GetVm("priv");
  ASSERT_TRUE(p.ok() && p->has_value());
  EXPECT_EQ((*p)->privileged, std::optional<bool>(true));
  auto listed = store_->ListVms({});
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  for (const auto& v : *listed) {
    EXPECT_EQ(v.privileged, std::optional<bool>(v.id == "priv")) << v.id;
  }
}

TEST_F(StoreTest, ListFiltersByState) {
  ASSERT_TRUE(store_->InsertVm(Vm("a1")).ok());
  ASSERT_TRUE(store_->InsertVm(Vm("a2")).ok());
  ASSERT_TRUE(store_->UpdateVmState("a1", "dead", "qemu exited").ok());
  auto running = store_->ListVms({"running"});
  ASSERT_TRUE(running.ok());
  ASSERT_EQ(running->size(), 1u);
  EXPECT_EQ((*running)[0].id, "a2");
  EXPECT_EQ(store_->ListVms()->size(), 2u);
}

TEST_F(StoreTest, ExecWithoutExitCodeStoresNull) {
  ASSERT_TRUE(store_->InsertVm(Vm("v")).ok());
  ExecRecord e;
  e.vm_id = "v";
  e.argv = {"sleep", "9"};
  e.started_at = NowSeconds();
  e.outcome = "running";
  auto id = store_->InsertExec(e);
  ASSERT_TRUE(id.ok());
  e.id = *id;
  e.outcome = "channel_lost";
  e.error = "channel lost: connection closed";
  e.ended_at = NowSeconds();
  ASSERT_TRUE(store_->FinishExec(e).ok());
  auto list = store_->ListExecs("v");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].outcome, "channel_lost");
  EXPECT_FALSE((*list)[0].exit_code.has_value());  // a missing exit code is not 0
  EXPECT_EQ((*list)[0].argv[0], "sleep");
}

// Issue 51.7: the duration is the monotonic one the daemon measured, whatever the wall times
// say (a step of the host's clock between them); a row without one (recorded before schema
// version 6) falls back to their difference, never below 0.
TEST_F(StoreTest, AnExecKeepsItsMonotonicDurationAcrossAWallClockStep) {
  ASSERT_TRUE(store_->InsertVm(Vm("v")).ok());
  ExecRecord e;
  e.vm_id = "v";
  e.argv = {"sleep", "20"};
  e.started_at = 1000;
  e.outcome = "running";
  auto id = store_->InsertExec(e);
  ASSERT_TRUE(id.ok());
  auto running = store_->GetExec(*id);
  ASSERT_TRUE(running.ok() && running->has_value());
  EXPECT_FALSE((*running)->duration_ms.has_value());
  EXPECT_FALSE((*running)->Duration().has_value());
  e.id = *id;
  e.outcome = "exited";
  e.exit_code = 0;
  e.ended_at = 1000 + 7220;  // the wall clock was stepped +2 h meanwhile
  e.duration_ms = 20000;
  ASSERT_TRUE(store_->FinishExec(e).ok());
  auto done = store_->GetExec(*id);
  ASSERT_TRUE(done.ok() && done->has_value());
  EXPECT_EQ((*done)->duration_ms, std::optional<int64_t>(20000));
  EXPECT_EQ((*done)->Duration(), std::optional<int64_t>(20000));
  EXPECT_EQ((*done)->ended_at, 8220);  // the time of day stays as it was read

  ExecRecord old;
  old.started_at = 1000;
  old.ended_at = 990;  // a step back, in a row without a kept duration
  EXPECT_EQ(old.Duration(), std::optional<int64_t>(0));
  old.ended_at = 1002.5;
  EXPECT_EQ(old.Duration(), std::optional<int64_t>(2500));
}

// synchronous=NORMAL skips the fsync of each commit; what a daemon recorded must still be
// there after it is killed without closing the database.
TEST_F(StoreTest, CommitsSurviveADaemonKilledWithoutClosing) {
  const std::string path = dir_->path() + "/crash.db";
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto s = Store::Open(path);
    if (!s.ok() || !(*s)->InsertVm(Vm("crashed")).ok()) ::_exit(1);
    ExecRecord e;
    e.vm_id = "crashed";
    e.argv = {"true"};
    e.outcome = "running";
    if (!(*s)->InsertExec(e).ok()) ::_exit(1);
    ::kill(::getpid(), SIGKILL);  // no close, no checkpoint
    ::_exit(1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the writer failed before its crash";
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto vm = (*s)->GetVm("crashed");
  ASSERT_TRUE(vm.ok());
  ASSERT_TRUE(vm->has_value());
  auto execs = (*s)->ListExecs("crashed");
  ASSERT_TRUE(execs.ok());
  EXPECT_EQ(execs->size(), 1u);
  // The WAL kept what was committed: nothing is behind the mark.
  EXPECT_TRUE((*s)->info().warning.empty()) << (*s)->info().warning;
}

TEST_F(StoreTest, EgressDecisionIsRecordedThenFinished) {
  EgressRecord e;
  e.vm_id = "aaa";
  e.started_at = NowSeconds();
  e.method = "CONNECT";
  e.host = "api.test";
  e.port = 443;
  e.address = "127.0.0.1:443";
  e.verdict = "allowed";
  e.reason = "host and port on the allow-list";
  e.override_used = true;
  e.status = 200;
  auto id = store_->InsertEgress(e);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EgressRecord other = e;
  other.vm_id = "bbb";
  other.verdict = "refused";
  ASSERT_TRUE(store_->InsertEgress(other).ok());
  e.id = *id;
  e.ended_at = NowSeconds();
  e.bytes_up = 10;
  e.bytes_down = 20;
  e.duration_ms = 5;
  ASSERT_TRUE(store_->FinishEgress(e).ok());
  auto rows = store_->ListEgress("aaa");
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].host, "api.test");
  EXPECT_EQ((*rows)[0].bytes_down, 20);
  EXPECT_TRUE((*rows)[0].override_used);
  EXPECT_EQ(store_->ListEgress("")->size(), 2u);
  EXPECT_EQ(store_->ListEgress("", 1)->at(0).vm_id, "bbb");
  e.id = 999;
  EXPECT_EQ(store_->FinishEgress(e).code(), Code::kNotFound);
}

TEST_F(StoreTest, WorkspaceAndCollectsAreRecordedWithTheirChanges) {
  ASSERT_TRUE(store_->InsertVm(Vm("w1")).ok());
  auto none = store_->GetWorkspace("w1");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  WorkspaceRecord w;
  w.vm_id = "w1";
  w.dir = "/home/u/proj";
  w.excludes = {"*.log"};
  w.manifest = Json::array({{{"path", "a"}, {"size", 1}}});
  w.quota_bytes = 1024;
  w.files = 1;
  w.bytes = 1;
  w.injected_at = NowSeconds();
  ASSERT_TRUE(store_->InsertWorkspace(w).ok());
  EXPECT_FALSE(store_->InsertWorkspace(w).ok());  // one workspace per VM
  ASSERT_TRUE(store_->SetWorkspaceSetup("w1", std::nullopt, "setup output").ok());
  auto got = store_->GetWorkspace("w1");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->dir, "/home/u/proj");
  EXPECT_EQ((*got)->excludes[0], "*.log");
  EXPECT_EQ((*got)->manifest[0]["path"], "a");
  EXPECT_FALSE((*got)->setup_exec_id.has_value());
  EXPECT_EQ((*got)->setup_output, "setup output");

  auto last = store_->LastExecId("w1");
  ASSERT_TRUE(last.ok());
  EXPECT_FALSE(last->has_value());
  CollectRecord failed;
  failed.vm_id = "w1";
  failed.outcome = "error";
  failed.error = "over the quota";
  ASSERT_TRUE(store_->InsertCollect(failed).ok());
  CollectRecord c;
  c.vm_id = "w1";
  c.outcome = "ok";
  c.commit = "abc";
  c.branch = "trybox/w1";
  c.changes =
      Json::array({{{"change", "renamed"},
                    {"path", "b"},
                    {"from", "a"},
                    {"old_size", 1},
                    {"new_size", 1},
                    {"old_mode", 420},
                    {"new_mode", 420}},
                   {{"change", "added"}, {"path", "c"}, {"new_size", 5}, {"new_mode", 493}}});
  ASSERT_TRUE(store_->InsertCollect(c).ok());
  auto latest = store_->LatestCollect("w1");
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ((*latest)->outcome, "ok");
  EXPECT_EQ((*latest)->commit, "abc");
  ASSERT_EQ((*latest)->changes.size(), 2u);
  EXPECT_EQ((*latest)->changes[0]["from"], "a");
  EXPECT_FALSE((*latest)->changes[1].contains("old_size"));  // NULL, not 0
  EXPECT_EQ((*latest)->changes[1]["new_size"], 5);
}

TEST_F(StoreTest, AgentRunIsReplacedWholeAndReadBack) {
  AgentRunRecord r;
  r.id = "run1";
  r.created_at = NowSeconds();
  r.updated_at = r.created_at;
  r.outcome = "RUNNING";
  r.vm_id = "vm1";
  r.state = {{"task", "t"}};
  r.transcript = Json::array({{{"kind", "user"}, {"text", "t"}}});
  ASSERT_TRUE(store_->PutAgentRun(r).ok());
  r.outcome = "NEEDS_INPUT";
  r.state["question"] = "which?";
  ASSERT_TRUE(store_->PutAgentRun(r).ok());
  auto got = store_->GetAgentRun("run1");
  ASSERT_TRUE(got.ok());
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->outcome, "NEEDS_INPUT");
  EXPECT_EQ((*got)->state["question"], "which?");
  EXPECT_EQ((*got)->transcript.size(), 1u);
  auto none = store_->GetAgentRun("nope");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

// Names that are not UTF-8 reach the store as workspace::ChangesToJson writes them
// ("path" for display, "path_b64" exact); the store keeps both and gives both back.
TEST_F(StoreTest, CollectKeepsNamesThatAreNotUtf8Exactly) {
  ASSERT_TRUE(store_->InsertVm(Vm("w1")).ok());
  CollectRecord c;
  c.vm_id = "w1";
  c.outcome = "ok";
  c.changes = Json::array({{{"change", "renamed"},
                            {"path", "new\\xff"},
                            {"path_b64", "bmV3/w=="},
                            {"from", "old\\xfe"},
                            {"from_b64", "b2xk/g=="},
                            {"old_size", 1},
                            {"new_size", 1}},
                           {{"change", "added"}, {"path", "caf\xc3\xa9"}, {"new_size", 2}}});
  c.skipped = Json::array({{{"path", "s\\xff"}, {"path_b64", "c/8="}, {"reason", "a fifo"}}});
  c.skipped_unlisted = 7;
  ASSERT_TRUE(store_->InsertCollect(c).ok());
  auto latest = store_->LatestCollect("w1");
  ASSERT_TRUE(latest.ok() && latest->has_value());
  const Json& ch = (*latest)->changes;
  ASSERT_EQ(ch.size(), 2u);
  EXPECT_EQ(ch[0]["path"], "caf\xc3\xa9");
  EXPECT_FALSE(ch[0].contains("path_b64"));
  EXPECT_EQ(ch[1]["path_b64"], "bmV3/w==");
  EXPECT_EQ(ch[1]["from_b64"], "b2xk/g==");
  EXPECT_EQ((*latest)->skipped[0]["path_b64"], "c/8=");
  EXPECT_EQ((*latest)->skipped_unlisted, 7);
}

// A string that is not UTF-8 and reached a JSON column anyway costs a U+FFFD, not the
// record (json::dump would throw).
TEST_F(StoreTest, JsonColumnsNeverThrowOnBytesThatAreNotUtf8) {
  ASSERT_TRUE(store_->InsertVm(Vm("w2")).ok());
  WorkspaceRecord w;
  w.vm_id = "w2";
  w.dir = "/p";
  w.manifest = Json::array({{{"path", std::string("raw\xff")}}});
  w.skipped = Json::array({{{"path", std::string("raw\xfe")}, {"reason", "x"}}});
  w.quota_entries = 12345;
  ASSERT_TRUE(store_->InsertWorkspace(w).ok());
  auto got = store_->GetWorkspace("w2");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->manifest[0]["path"], "raw\xef\xbf\xbd");
  EXPECT_EQ((*got)->quota_entries, 12345);
  ExecRecord e;
  e.vm_id = "w2";
  e.argv = {std::string("bad\xff")};
  e.outcome = "running";
  EXPECT_TRUE(store_->InsertExec(e).ok());
}

TEST(StoreMigrationTest, DatabaseOfAnEarlierVersionGainsTheNewColumns) {
  auto d = TempDir::Make("/tmp", "store-test-");
  ASSERT_TRUE(d.ok());
  std::string path = d->path() + "/old.db";
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  const char* old_schema = R"sql(
    CREATE TABLE vms (id TEXT PRIMARY KEY, image TEXT NOT NULL, image_sha256 TEXT NOT NULL,
      state TEXT NOT NULL, pid INTEGER NOT NULL, accel TEXT NOT NULL,
      memory_mib INTEGER NOT NULL, cpus INTEGER NOT NULL, dir TEXT NOT NULL,
      created_at REAL NOT NULL, ended_at REAL NOT NULL DEFAULT 0, note TEXT NOT NULL DEFAULT '');
    CREATE TABLE workspaces (vm_id TEXT PRIMARY KEY REFERENCES vms(id), dir TEXT NOT NULL,
      base TEXT NOT NULL, excludes TEXT NOT NULL, manifest TEXT NOT NULL,
      quota_bytes INTEGER NOT NULL, files INTEGER NOT NULL, bytes INTEGER NOT NULL,
      skipped TEXT NOT NULL, injected_at REAL NOT NULL, setup_exec_id INTEGER,
      setup_output TEXT NOT NULL DEFAULT '');
    CREATE TABLE collects (id INTEGER PRIMARY KEY AUTOINCREMENT,
      vm_id TEXT NOT NULL REFERENCES vms(id), exec_id INTEGER, collected_at REAL NOT NULL,
      outcome TEXT NOT NULL, error TEXT NOT NULL DEFAULT '', files INTEGER NOT NULL DEFAULT 0,
      bytes INTEGER NOT NULL DEFAULT 0, skipped TEXT NOT NULL DEFAULT '[]',
      commit_id TEXT NOT NULL DEFAULT '', branch TEXT NOT NULL DEFAULT '',
      note TEXT NOT NULL DEFAULT '');
    CREATE TABLE file_changes (collect_id INTEGER NOT NULL REFERENCES collects(id),
      change TEXT NOT NULL, path TEXT NOT NULL, old_path TEXT NOT NULL DEFAULT '',
      old_size INTEGER, new_size INTEGER, old_mode INTEGER, new_mode INTEGER);
    INSERT INTO vms VALUES ('old', 'debian-12', 'ab', 'destroyed', 1, 'tcg', 512, 1, '/x', 1, 2, '');
    INSERT INTO workspaces VALUES ('old', '/p', '', '[]', '[]', 1024, 0, 0, '[]', 1, NULL, '');
    INSERT INTO collects (vm_id, collected_at, outcome) VALUES ('old', 3, 'ok');
    INSERT INTO file_changes (collect_id, change, path, new_size) VALUES (1, 'added', 'a', 1);
  )sql";
  ASSERT_EQ(sqlite3_exec(db, old_schema, nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);

  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto w = (*s)->GetWorkspace("old");
  ASSERT_TRUE(w.ok() && w->has_value()) << w.status().ToString();
  EXPECT_EQ((*w)->quota_entries, 100000);
  auto c = (*s)->LatestCollect("old");
  ASSERT_TRUE(c.ok() && c->has_value()) << c.status().ToString();
  EXPECT_EQ((*c)->changes[0]["path"], "a");
  CollectRecord next;
  next.vm_id = "old";
  next.outcome = "ok";
  next.changes = Json::array({{{"change", "added"}, {"path", "b\\xff"}, {"path_b64", "Yv8="}}});
  ASSERT_TRUE((*s)->InsertCollect(next).ok());
  EXPECT_EQ((*s)->LatestCollect("old")->value().changes[0]["path_b64"], "Yv8=");
  // A VM recorded before the store kept --privileged: not known, never "no" (issue 41.5).
  auto old_vm = (*s)->GetVm("old");
  ASSERT_TRUE(old_vm.ok() && old_vm->has_value());
  EXPECT_FALSE((*old_vm)->privileged.has_value());
  // Opening again finds nothing left to add.
  s->reset();
  EXPECT_TRUE(Store::Open(path).ok());
}

EgressRecord Egress(const std::string& vm, double started, double ended) {
  EgressRecord e;
  e.vm_id = vm;
  e.started_at = started;
  e.ended_at = ended;
  e.method = "CONNECT";
  e.host = "h.test";
  e.port = 443;
  e.verdict = ended ? "refused" : "allowed";
  return e;
}

TEST_F(StoreTest, PruneEgressByAgeAndByCountKeepsTunnelsThatMayBeOpen) {
  const double now = 1'000'000;
  ASSERT_TRUE(store_->InsertVm(Vm("live")).ok());
  ASSERT_TRUE(store_->InsertVm(Vm("gone")).ok());
  ASSERT_TRUE(store_->UpdateVmState("gone", "destroyed", "").ok());
  auto add = [&](const EgressRecord& e) {
    auto id = store_->InsertEgress(e);
    ASSERT_TRUE(id.ok());
    if (e.ended_at) {
      EgressRecord f = e;
      f.id = *id;
      ASSERT_TRUE(store_->FinishEgress(f).ok());
    }
  };
  for (int i = 0; i < 10; ++i) add(Egress("gone", now - 10'000 + i, now - 9'000 + i));  // old
  add(Egress("live", now - 20'000, 0));          // an old tunnel of a running VM: maybe still open
  add(Egress("gone", now - 20'000, 0));          // never closed, VM gone: a crash left it
  add(Egress("gone", now - 20'000, now - 100));  // started long ago, ended recently
  for (int i = 0; i < 5; ++i) add(Egress("gone", now - 50 + i, now - 40 + i));  // recent

  auto removed = store_->PruneEgress(3'600, 0, now);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_EQ(*removed, 11);  // the ten old ones and the one a crash left open
  auto rows = store_->ListEgress("", 100);
  ASSERT_EQ(rows->size(), 7u);
  EXPECT_EQ(rows->at(0).vm_id, "live");

  removed = store_->PruneEgress(0, 3, now);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(*removed, 3);
  rows = store_->ListEgress("", 100);
  ASSERT_EQ(rows->size(), 4u);  // the newest three, and the live one
  EXPECT_EQ(rows->at(0).vm_id, "live");
  EXPECT_EQ(rows->at(3).started_at, now - 50 + 4);

  EXPECT_EQ(store_->PruneEgress(3'600, 3, now).value_or(-1), 0);
  // What was deleted left the disk too: the WAL was checkpointed and truncated.
  struct stat st;
  ASSERT_EQ(::stat((dir_->path() + "/t.db-wal").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0);
}

ExecRecord Exec(const std::string& vm) {
  ExecRecord e;
  e.vm_id = vm;
  e.argv = Json::array({"sleep", "1"});
  e.cwd = "/root";
  e.started_at = NowSeconds();
  e.outcome = "running";
  return e;
}

TEST_F(StoreTest, ExecsAreReadBackByIdAndCountedPerRunningVm) {
  ASSERT_TRUE(store_->InsertVm(Vm("v1")).ok());
  ASSERT_TRUE(store_->InsertVm(Vm("v2")).ok());
  auto a = store_->InsertExec(Exec("v1"));
  auto b = store_->InsertExec(Exec("v1"));
  ASSERT_TRUE(a.ok() && b.ok());
  ExecRecord done = Exec("v1");
  done.id = *a;
  done.outcome = "exited";
  done.exit_code = 0;
  done.ended_at = NowSeconds();
  done.stdout_bytes = 12;
  ASSERT_TRUE(store_->FinishExec(done).ok());
  auto got = store_->GetExec(*a);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->vm_id, "v1");
  EXPECT_EQ((*got)->outcome, "exited");
  EXPECT_EQ((*got)->exit_code, 0);
  EXPECT_EQ((*got)->stdout_bytes, 12);
  EXPECT_FALSE(store_->GetExec(*b + 100)->has_value());
  auto counts = store_->CountExecs();
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->at("v1").total, 2);
  EXPECT_EQ(counts->at("v1").running, 1);
  EXPECT_EQ(counts->count("v2"), 0u);
}

TEST_F(StoreTest, PruneDeletesOnlyVmsThatEndedBeforeTheCutoffWithTheirRows) {
  for (const char* id : {"old", "gone", "live"}) ASSERT_TRUE(store_->InsertVm(Vm(id)).ok());
  for (const char* id : {"old", "gone", "live"}) ASSERT_TRUE(store_->InsertExec(Exec(id)).ok());
  WorkspaceRecord w;
  w.vm_id = "old";
  w.dir = "/src";
  w.setup_exec_id = static_cast<int>(*store_->LastExecId("old").value());
  ASSERT_TRUE(store_->InsertWorkspace(w).ok());
  CollectRecord c;
  c.vm_id = "old";
  c.outcome = "ok";
  c.changes = Json::array({{{"change", "added"}, {"path", "a"}}});
  ASSERT_TRUE(store_->InsertCollect(c).ok());
  ASSERT_TRUE(store_->UpdateVmState("old", "destroyed", "{}").ok());
  ASSERT_TRUE(store_->UpdateVmState("gone", "reaped", "{}").ok());
  // Nothing ended before an hour ago.
  auto none = store_->PruneVms(NowSeconds() - 3600);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->ids.empty());
  auto pruned = store_->PruneVms(NowSeconds() + 1);
  ASSERT_TRUE(pruned.ok()) << pruned.status().ToString();
  std::sort(pruned->ids.begin(), pruned->ids.end());
  EXPECT_EQ(pruned->ids, (std::vector<std::string>{"gone", "old"}));
  EXPECT_EQ(pruned->execs, 2);
  EXPECT_EQ(pruned->collects, 1);
  EXPECT_EQ(pruned->file_changes, 1);
  EXPECT_FALSE(store_->GetVm("old")->has_value());
  EXPECT_TRUE(store_->ListExecs("old")->empty());
  EXPECT_FALSE(store_->GetWorkspace("old")->has_value());
  EXPECT_FALSE(store_->LatestCollect("old")->has_value());
  // A running VM is never pruned, however old.
  EXPECT_TRUE(store_->GetVm("live")->has_value());
  EXPECT_EQ(store_->ListExecs("live")->size(), 1u);
}

TEST_F(StoreTest, RetentionByCountDeletesExactlyTheOldestEndedVmsAndNeverALiveOne) {
  // Ended in order e0 (oldest) .. e4; "live" is running and "dead" died but is not destroyed.
  for (int i = 0; i < 5; ++i) {
    std::string id = "e" + std::to_string(i);
    ASSERT_TRUE(store_->InsertVm(Vm(id)).ok());
    ASSERT_TRUE(store_->InsertExec(Exec(id)).ok());
    ASSERT_TRUE(store_->UpdateVmState(id, "destroyed", "{}").ok());
  }
  for (const char* id : {"live", "dead"}) {
    ASSERT_TRUE(store_->InsertVm(Vm(id)).ok());
    ASSERT_TRUE(store_->InsertExec(Exec(id)).ok());
  }
  ASSERT_TRUE(store_->UpdateVmState("dead", "dead", "qemu exited").ok());
  // A dry run counts exactly what the real one removes, and removes nothing.
  auto dry = store_->PruneVms(0, 2, true);
  ASSERT_TRUE(dry.ok()) << dry.status().ToString();
  std::sort(dry->ids.begin(), dry->ids.end());
  EXPECT_EQ(dry->ids, (std::vector<std::string>{"e0", "e1", "e2"}));
  EXPECT_EQ(dry->execs, 3);
  EXPECT_TRUE(store_->GetVm("e0")->has_value());
  EXPECT_EQ(store_->ListExecs("e0")->size(), 1u);
  auto real = store_->PruneVms(0, 2, false);
  ASSERT_TRUE(real.ok());
  std::sort(real->ids.begin(), real->ids.end());
  EXPECT_EQ(real->ids, dry->ids);
  EXPECT_EQ(real->execs, 3);
  for (const char* gone : {"e0", "e1", "e2"}) EXPECT_FALSE(store_->GetVm(gone)->has_value());
  for (const char* kept : {"e3", "e4", "live", "dead"}) {
    EXPECT_TRUE(store_->GetVm(kept)->has_value()) << kept;
    EXPECT_EQ(store_->ListExecs(kept)->size(), 1u) << kept;
  }
  // Again: nothing more to do.
  EXPECT_TRUE(store_->PruneVms(0, 2, false)->ids.empty());
  // With a count of 0 (no limit) and no age limit, nothing at all.
  EXPECT_TRUE(store_->PruneVms(0, 0, false)->ids.empty());
}

TEST_F(StoreTest, RetentionOfAgentRunsKeepsLiveRunsAndRunsWhoseVmRuns) {
  ASSERT_TRUE(store_->InsertVm(Vm("runvm")).ok());
  const double now = NowSeconds();
  auto put = [&](const std::string& id, double updated, const std::string& vm) {
    AgentRunRecord r;
    r.id = id;
    r.created_at = updated;
    r.updated_at = updated;
    r.outcome = "DONE";
    r.vm_id = vm;
    ASSERT_TRUE(store_->PutAgentRun(r).ok());
  };
  put("old", now - 7200, "gonevm");
  put("old-live", now - 7200, "gonevm");
  put("old-vm-runs", now - 7200, "runvm");
  put("new", now, "gonevm");
  auto dry = store_->PruneAgentRuns(now - 3600, 0, {"old-live"}, true);
  ASSERT_TRUE(dry.ok()) << dry.status().ToString();
  EXPECT_EQ(*dry, (std::vector<std::string>{"old"}));
  EXPECT_TRUE(store_->GetAgentRun("old")->has_value());
  auto pruned = store_->PruneAgentRuns(now - 3600, 0, {"old-live"}, false);
  ASSERT_TRUE(pruned.ok());
  EXPECT_EQ(*pruned, (std::vector<std::string>{"old"}));
  EXPECT_FALSE(store_->GetAgentRun("old")->has_value());
  for (const char* kept : {"old-live", "old-vm-runs", "new"}) {
    EXPECT_TRUE(store_->GetAgentRun(kept)->has_value()) << kept;
  }
  // By count: the newest one kept of those that may go.
  EXPECT_EQ(store_->PruneAgentRuns(0, 1, {"old-live"}, false).value_or({}),
            (std::vector<std::string>{}));
}

TEST_F(StoreTest, DryRunOfEgressRetentionCountsWithoutRemoving) {
  const double now = NowSeconds();
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(store_->InsertEgress(Egress("v", now - 7200, now - 7200)).ok());
  EXPECT_EQ(store_->PruneEgress(3600, 0, now, true).value_or(-1), 4);
  EXPECT_EQ(store_->ListEgress("")->size(), 4u);
  EXPECT_EQ(store_->PruneEgress(3600, 0, now, false).value_or(-1), 4);
  EXPECT_TRUE(store_->ListEgress("")->empty());
}

// The guard (docs/store.md, "The file and its guard"). Each case failed before it: Open
// took an empty file as a new store, opened a damaged or foreign one, and had no mark.
class StoreGuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = TempDir::Make("/tmp", "store-guard-");
    ASSERT_TRUE(d.ok());
    dir_.emplace(std::move(*d));
    path_ = dir_->path() + "/trybox.db";
  }
  // A store with rows, closed (so all of it is in the main file).
  void MakeStore(int vms) {
    auto s = Store::Open(path_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    for (int i = 0; i < vms; ++i) {
      VmRecord v = Vm("vm" + std::to_string(i));
      v.note = std::string(300, 'n');
      ASSERT_TRUE((*s)->InsertVm(v).ok());
    }
  }
  void ExpectRefused(const std::string& why) {
    auto s = Store::Open(path_);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), Code::kFailedPrecondition);
    EXPECT_NE(s.status().message().find(path_), std::string::npos) << s.status().message();
    EXPECT_NE(s.status().message().find(why), std::string::npos) << s.status().message();
    EXPECT_NE(s.status().message().find("move it aside"), std::string::npos);
  }
  std::optional<TempDir> dir_;
  std::string path_;
};

TEST_F(StoreGuardTest, MissingFileMakesANewVersionedStore) {
  auto s = Store::Open(path_);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  StoreInfo info = (*s)->info();
  EXPECT_TRUE(info.created);
  EXPECT_EQ(info.schema_version, LatestSchemaVersion());
  EXPECT_TRUE(info.warning.empty());
  EXPECT_FALSE(std::filesystem::exists(path_ + ".new"));
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  EXPECT_EQ(PragmaInt(db, "application_id").value_or(0), kApplicationId);
  EXPECT_EQ(PragmaInt(db, "user_version").value_or(0), LatestSchemaVersion());
  sqlite3_close(db);
}

TEST_F(StoreGuardTest, EmptyFileIsRefusedNotTakenAsANewStore) {
  MakeStore(3);
  ASSERT_EQ(::truncate(path_.c_str(), 0), 0);
  ExpectRefused("is empty (0 bytes)");
  // Still 0 bytes: nothing was written over it.
  EXPECT_EQ(std::filesystem::file_size(path_), 0u);
}

TEST_F(StoreGuardTest, DamagedPageIsRefused) {
  MakeStore(200);
  auto fd = OpenFile(path_, O_RDWR);
  ASSERT_TRUE(fd.ok());
  // Page 2 is the root of the vms table: garbage over it, as a torn write would leave.
  std::string garbage(4096, '\xab');
  ASSERT_EQ(::pwrite(fd->get(), garbage.data(), garbage.size(), 4096), 4096);
  ExpectRefused("is damaged");
}

TEST_F(StoreGuardTest, FileThatIsNotSqliteIsRefused) {
  ASSERT_TRUE(WriteFileAtomic(path_, std::string(8192, 'x'), 0600).ok());
  ExpectRefused("not a SQLite database");
}

TEST_F(StoreGuardTest, AnotherProgramsDatabaseIsRefused) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT)", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  ExpectRefused("not a trybox store");
  // Nor when it claims another application id, whatever its tables.
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE vms (id TEXT); PRAGMA application_id = 7", nullptr,
                         nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  ExpectRefused("not a trybox store");
}

TEST_F(StoreGuardTest, StoreOfANewerSchemaIsRefused) {
  MakeStore(1);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 999", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto s = Store::Open(path_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("newer trybox"), std::string::npos);
}

TEST_F(StoreGuardTest, StoreFromBeforeVersionsIsMigratedAndMigrationsAreIdempotent) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  // What main's store made: no application_id, no user_version, no meta table.
  ASSERT_EQ(sqlite3_exec(db,
                         "CREATE TABLE vms (id TEXT PRIMARY KEY, image TEXT NOT NULL, "
                         "image_sha256 TEXT NOT NULL, state TEXT NOT NULL, pid INTEGER NOT NULL, "
                         "accel TEXT NOT NULL, memory_mib INTEGER NOT NULL, cpus INTEGER NOT "
                         "NULL, dir TEXT NOT NULL, created_at REAL NOT NULL, ended_at REAL NOT "
                         "NULL DEFAULT 0, note TEXT NOT NULL DEFAULT ''); INSERT INTO vms VALUES "
                         "('kept', 'debian-12', 'ab', 'destroyed', 1, 'tcg', 512, 1, '/x', 1, 2, "
                         "'')",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  {
    auto s = Store::Open(path_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ((*s)->info().found_version, 0);
    EXPECT_FALSE((*s)->info().created);
    EXPECT_EQ((*s)->info().schema_version, LatestSchemaVersion());
    EXPECT_TRUE((*s)->GetVm("kept")->has_value());
    EXPECT_TRUE((*s)->CheckWritable().ok());
  }
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  EXPECT_EQ(PragmaInt(db, "application_id").value_or(0), kApplicationId);
  // Running every step again over a migrated store changes nothing and fails nothing.
  EXPECT_TRUE(Migrate(db, 0).ok());
  EXPECT_TRUE(Migrate(db, LatestSchemaVersion()).ok());
  EXPECT_EQ(PragmaInt(db, "user_version").value_or(0), LatestSchemaVersion());
  sqlite3_close(db);
  auto again = Store::Open(path_);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)->info().found_version, LatestSchemaVersion());
  EXPECT_TRUE((*again)->GetVm("kept")->has_value());
}

TEST_F(StoreGuardTest, LostWriteAheadLogIsReportedAsRowsBehindTheMark) {
  MakeStore(1);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto s = Store::Open(path_);
    ExecRecord e;
    e.vm_id = "vm0";
    e.argv = {"true"};
    e.outcome = "running";
    if (!s.ok() || !(*s)->InsertExec(e).ok()) ::_exit(1);
    ::kill(::getpid(), SIGKILL);  // the exec is in the WAL only
    ::_exit(1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status));
  ASSERT_TRUE(std::filesystem::remove(path_ + "-wal"));
  (void)std::filesystem::remove(path_ + "-shm");
  auto s = Store::Open(path_);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::string warning = (*s)->info().warning;
  EXPECT_NE(warning.find("behind its mark"), std::string::npos) << warning;
  EXPECT_NE(warning.find("execs up to id 1"), std::string::npos) << warning;
  // Said once: the mark now follows what the store holds.
  s->reset();
  auto clean = Store::Open(path_);
  ASSERT_TRUE(clean.ok());
  EXPECT_TRUE((*clean)->info().warning.empty()) << (*clean)->info().warning;
}

}  // namespace
}  // namespace trybox::store
