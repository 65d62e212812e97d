// Bulk data through the transfer disk, against trybox-init's own put/get handlers over a
// real socketpair, with a regular file standing in for the disk on both sides (the host's
// Announce cuts or extends it, as QEMU's block_resize does). What goes through the disk,
// what falls back to the channel and why, and that the disk is empty after every transfer.
// Tree transfers (tar) need trybox-init's reaper; the e2e tests cover them.
#include "daemon/guest_disk.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "guest/files.h"
#include "guest/reaper.h"
#include "guest/transfer_disk.h"

namespace trybox::daemon {
namespace {

using channel::Mux;
using channel::Stream;
using Kind = Stream::Message::Kind;

// The host's side of the disk: a file, and every size announced.
class FilePort : public TransferDiskPort {
 public:
  explicit FilePort(const std::string& path) : fd_(::open(path.c_str(), O_RDWR | O_CLOEXEC)) {}
  int fd_for_io() const override { return fd_.get(); }
  Status Announce(uint64_t bytes) override {
    announced.push_back(bytes);
    if (::ftruncate(fd_.get(), static_cast<off_t>(bytes)) != 0) return ErrnoError("truncate");
    return Status::Ok();
  }
  std::unique_lock<std::timed_mutex> TryLock() override {
    return std::unique_lock<std::timed_mutex>(mu_, std::try_to_lock);
  }
  std::timed_mutex& mu() { return mu_; }
  std::vector<uint64_t> announced;

 private:
  UniqueFd fd_;
  std::timed_mutex mu_;
};

class DiskGuest : public GuestChannel {
 public:
  DiskGuest(UniqueFd fd, TransferDiskPort* port)
      : mux_(std::move(fd), channel::Role::kHost), port_(port) {
    mux_.Start();
  }
  Result<std::shared_ptr<Stream>> Open(const Json& r) override { return mux_.Open(r); }
  bool alive() const override { return mux_.alive(); }
  std::string death_reason() const override { return mux_.death_reason(); }
  TransferDiskPort* transfer_disk() override { return port_; }

 private:
  Mux mux_;
  TransferDiskPort* port_;
};

struct ClientConn {
  std::unique_ptr<Mux> client_mux, server_mux;
  std::shared_ptr<Stream> client;
  std::shared_ptr<Stream> server;
};

// A daemon-side verb stream with a real client at the other end.
ClientConn MakeClient(const Json& request) {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  ClientConn c;
  c.client_mux = std::make_unique<Mux>(UniqueFd(sv[0]), channel::Role::kHost);
  c.server_mux = std::make_unique<Mux>(UniqueFd(sv[1]), channel::Role::kGuest);
  std::promise<std::shared_ptr<Stream>> opened;
  c.server_mux->OnOpen([&opened](std::shared_ptr<Stream> s, Json) { opened.set_value(s); });
  c.server_mux->Start();
  c.client_mux->Start();
  c.client = *c.client_mux->Open(request);
  c.server = opened.get_future().get();
  return c;
}

struct Reply {
  Json meta;
  std::string data;
  Json end;
};

Reply ReadReply(Stream& s) {
  Reply r;
  for (;;) {
    auto m = s.Next();
    if (!m.ok()) return r;
    if (m->kind == Kind::kEvent) r.meta = m->body;
    if (m->kind == Kind::kData) r.data += m->data;
    if (m->kind == Kind::kEnd || m->kind == Kind::kReset) {
      r.end = m->body;
      return r;
    }
  }
}

class GuestDiskTest : public ::testing::Test {
 protected:
  // `guest_has_disk`: the guest's handlers get the disk (else they answer no_transfer_disk).
  void Start(bool guest_has_disk = true, const std::string& host_file = "") {
    auto dir = TempDir::Make(::testing::TempDir(), "guest_disk_test");
    ASSERT_TRUE(dir.ok());
    dir_.emplace(std::move(dir).value());
    const std::string disk = Path("xfer.img");
    ASSERT_TRUE(WriteFileAtomic(disk, "").ok());
    port_ = std::make_unique<FilePort>(host_file.empty() ? disk : host_file);
    if (guest_has_disk) {
      guest_disk_ = std::make_unique<guest::TransferDisk>(UniqueFd(::open(disk.c_str(), O_RDWR)));
    }
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    guest_mux_ = std::make_unique<Mux>(UniqueFd(sv[1]), channel::Role::kGuest);
    guest_mux_->OnOpen([this](std::shared_ptr<Stream> s, Json req) {
      {
        std::lock_guard<std::mutex> lock(handlers_mu_);
        ++handlers_;
      }
      if (req.contains("disk")) ++disk_requests_;
      if (req["op"] == "put") guest::ServePut(reaper_, *s, req, guest_disk_.get());
      if (req["op"] == "get") guest::ServeGet(reaper_, *s, req, guest_disk_.get());
      std::lock_guard<std::mutex> lock(handlers_mu_);
      --handlers_;
      handlers_cv_.notify_all();
    });
    guest_mux_->Start();
    guest_ = std::make_unique<DiskGuest>(UniqueFd(sv[0]), port_.get());
  }
  // The guest's handlers run on detached threads (as in trybox-init) and use this fixture:
  // it waits for those still running, with the host side closed first so that none waits
  // on it.
  void TearDown() override {
    guest_.reset();
    std::unique_lock<std::mutex> lock(handlers_mu_);
    handlers_cv_.wait(lock, [this] { return handlers_ == 0; });
  }
  std::string Path(const std::string& name) { return dir_->path() + "/" + name; }

  // The put verb of `data` to `path`, as the CLI sends it.
  Json Put(const std::string& path, const std::string& data) {
    ClientConn c = MakeClient({{"verb", "put"}});
    std::thread upload([&] {
      for (size_t at = 0; at < data.size(); at += 100000) {
        (void)c.client->Write(channel::kChanIn, std::string_view(data).substr(at, 100000));
      }
      (void)c.client->CloseWrite(channel::kChanIn);
    });
    RelayPut(*guest_,
             {{"op", "put"}, {"path", path}, {"kind", "file"}, {"mode", 0640}, {"mkdirs", true}},
             *c.server);
    upload.join();
    return ReadReply(*c.client).end;
  }

  Reply Get(const std::string& path) {
    ClientConn c = MakeClient({{"verb", "get"}});
    // Read as it comes: content past the client's window waits for the reader.
    std::thread relay([&] { RelayGet(*guest_, {{"op", "get"}, {"path", path}}, *c.server); });
    Reply r = ReadReply(*c.client);
    relay.join();
    return r;
  }

  uint64_t DiskSize() {
    struct stat st;
    return ::stat(Path("xfer.img").c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 1;
  }

  std::mutex handlers_mu_;
  std::condition_variable handlers_cv_;
  int handlers_ = 0;
  guest::Reaper reaper_;
  std::optional<TempDir> dir_;
  std::unique_ptr<FilePort> port_;
  std::unique_ptr<guest::TransferDisk> guest_disk_;
  std::unique_ptr<Mux> guest_mux_;
  std::unique_ptr<DiskGuest> guest_;
  std::atomic<int> disk_requests_{0};
};

std::string Data(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131) ^ (i >> 9));
  return s;
}

TEST_F(GuestDiskTest, AFileGoesInAndOutThroughTheDiskWhichIsEmptiedAfter) {
  Start();
  const std::string data = Data(kChannelMaxBytes + (3 << 20));
  Json end = Put(Path("in/f"), data);
  EXPECT_EQ(end, (Json{{"ok", true}, {"bytes", data.size()}, {"via", "disk"}}));
  EXPECT_EQ(ReadFileToString(Path("in/f")).value_or(""), data);
  // Announced: the content's size (whole sectors), then 0 once the guest was done.
  EXPECT_EQ(port_->announced, (std::vector<uint64_t>{data.size(), 0}));
  EXPECT_EQ(DiskSize(), 0u);

  port_->announced.clear();
  Reply r = Get(Path("in/f"));
  EXPECT_EQ(r.data, data);
  EXPECT_EQ(r.meta["kind"], "file");
  EXPECT_EQ(r.meta["mode"], 0640);
  EXPECT_EQ(r.end, (Json{{"ok", true}, {"bytes", data.size()}, {"via", "disk"}}));
  ASSERT_EQ(port_->announced.size(), 2u);
  EXPECT_EQ(port_->announced[0], TarReader::kMaxDiskTransfer);  // room given to the guest
  EXPECT_EQ(port_->announced[1], 0u);
  EXPECT_EQ(DiskSize(), 0u);
  EXPECT_EQ(disk_requests_, 2);
}

TEST_F(GuestDiskTest, SmallContentTakesTheChannelAndLargeContentTheDisk) {
  // The disk costs two QMP round trips (announce, empty): small content never pays them.
  Start();
  for (size_t size : {size_t{0}, size_t{1000}, size_t{kChannelMaxBytes}}) {
    SCOPED_TRACE(size);
    const std::string data = Data(size);
    EXPECT_EQ(Put(Path("small"), data)["via"], "channel");
    Reply r = Get(Path("small"));
    EXPECT_EQ(r.data, data);
    EXPECT_EQ(r.meta["size"], size);
    EXPECT_EQ(r.end, (Json{{"ok", true}, {"bytes", size}, {"via", "channel"}}));
  }
  EXPECT_TRUE(port_->announced.empty());
  EXPECT_EQ(disk_requests_, 0);
  // One byte more: both ways through the disk, the get after the guest said "too_large".
  const std::string data = Data(kChannelMaxBytes + 1);
  EXPECT_EQ(Put(Path("large"), data)["via"], "disk");
  Reply r = Get(Path("large"));
  EXPECT_EQ(r.data, data);
  EXPECT_EQ(r.meta["size"], data.size());
  EXPECT_EQ(r.end["via"], "disk");
  EXPECT_EQ(disk_requests_, 2);
  EXPECT_EQ(DiskSize(), 0u);
}

TEST_F(GuestDiskTest, ABusyDiskLeavesTheTransferToTheChannel) {
  Start();
  std::lock_guard<std::timed_mutex> busy(port_->mu());
  const std::string data = Data(kChannelMaxBytes + 200000);
  EXPECT_EQ(Put(Path("f"), data)["via"], "channel");
  EXPECT_EQ(Get(Path("f")).data, data);
  EXPECT_TRUE(port_->announced.empty());
  EXPECT_EQ(disk_requests_, 0);
}

TEST_F(GuestDiskTest, AGuestWithoutTheDiskSaysSoAndTheChannelCarriesIt) {
  Start(/*guest_has_disk=*/false);
  const std::string data = Data(kChannelMaxBytes + 500000);
  // The upload was already on the host's file: it is replayed through the channel.
  EXPECT_EQ(Put(Path("f"), data)["via"], "channel");
  EXPECT_EQ(ReadFileToString(Path("f")).value_or(""), data);
  Reply r = Get(Path("f"));
  EXPECT_EQ(r.data, data);
  EXPECT_EQ(r.end["via"], "channel");
  EXPECT_EQ(DiskSize(), 0u);
}

TEST_F(GuestDiskTest, AHostDiskThatFillsUpMidPutHandsTheRestToTheChannel) {
  Start(true, "/dev/full");  // every write to the host's file fails with ENOSPC
  const std::string data = Data(kChannelMaxBytes + (1 << 20));
  EXPECT_EQ(Put(Path("f"), data)["via"], "channel");
  EXPECT_EQ(ReadFileToString(Path("f")).value_or(""), data);
  EXPECT_EQ(disk_requests_, 0);
}

TEST_F(GuestDiskTest, ContentLargerThanTheRoomIsRefusedBeforeAnythingIsSent) {
  Start();
  ASSERT_TRUE(WriteFileAtomic(Path("big"), Data(10000)).ok());
  auto got = GetViaDisk(*guest_, {{"op", "get"}, {"path", Path("big")}}, 4096);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, nullptr);  // disk_full: the caller takes the channel
  EXPECT_EQ(DiskSize(), 0u);
  auto fits = GetViaDisk(*guest_, {{"op", "get"}, {"path", Path("big")}}, 10000);
  ASSERT_TRUE(fits.ok() && *fits);
  EXPECT_EQ((*fits)->bytes(), 10000u);
  EXPECT_EQ((*fits)->Read(1 << 20).value_or(""), Data(10000));
}

TEST_F(GuestDiskTest, TheGuestsOwnFailureThroughTheDiskIsKept) {
  Start();
  Json greq = {{"op", "get"}, {"path", Path("none")}};
  auto got = GetViaDisk(*guest_, greq, 512);
  ASSERT_TRUE(got.ok());
  ASSERT_NE(*got, nullptr);
  EXPECT_EQ((*got)->end()["error"], "not_found");  // the guest's own failure, kept
  EXPECT_EQ((*got)->bytes(), 0u);
}

}  // namespace
}  // namespace trybox::daemon
