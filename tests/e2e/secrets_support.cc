#include "tests/e2e/secrets_support.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "util/ascii.h"
#include "util/process.h"
#include "vmm/qmp.h"

namespace trybox::e2e {

using Clock = std::chrono::steady_clock;

TlsOrigin::TlsOrigin(egress::CertAuthority& ca, const std::string& name, std::string git_root,
                     std::string git_auth)
    : git_root_(std::move(git_root)), git_auth_(std::move(git_auth)) {
  ctx_ = ca.ServerContext(name).value();
  l_ = ListenTcpLoopback(0, 64).value();
  accept_ = std::thread([this] {
    for (;;) {
      auto c = AcceptTcp(l_.fd.get());
      if (!c.ok()) return;
      std::lock_guard<std::mutex> lock(mu_);
      conns_.emplace_back([this, fd = std::move(*c)]() mutable { Serve(std::move(fd)); });
    }
  });
}

TlsOrigin::~TlsOrigin() {
  ::shutdown(l_.fd.get(), SHUT_RDWR);
  accept_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& t : conns_) t.join();
}

std::vector<std::string> TlsOrigin::heads() {
  std::lock_guard<std::mutex> lock(mu_);
  return heads_;
}

std::vector<std::string> TlsOrigin::bodies() {
  std::lock_guard<std::mutex> lock(mu_);
  return bodies_;
}

void TlsOrigin::Serve(UniqueFd fd) {
  auto tls =
      egress::TlsStream::Accept(std::move(fd), ctx_, Clock::now() + std::chrono::seconds(30));
  if (!tls.ok()) return;
  std::string head;
  while (head.find("\r\n\r\n") == std::string::npos) {
    auto more = (*tls)->Read(16384, Clock::now() + std::chrono::seconds(30));
    if (!more.ok() || more->empty()) return;
    head += *more;
  }
  const std::string first = head.substr(0, head.find("\r\n\r\n"));
  {
    std::lock_guard<std::mutex> lock(mu_);
    heads_.push_back(first);
  }
  if (!git_root_.empty() && first.find(" /git/") != std::string::npos) {
    (void)(*tls)->Write(Git(**tls, head));
    (void)(*tls)->CloseWrite();
    return;
  }
  if (std::string length = Header(first + "\r\n", "content-length"); !length.empty()) {
    std::string body = head.substr(first.size() + 4);
    size_t want = static_cast<size_t>(std::atoll(length.c_str()));
    while (body.size() < want) {
      auto more = (*tls)->Read(16384, Clock::now() + std::chrono::seconds(30));
      if (!more.ok() || more->empty()) return;
      body += *more;
    }
    std::lock_guard<std::mutex> lock(mu_);
    bodies_.push_back(body);
  }
  (void)(*tls)->Write(
      "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nSet-Cookie: session=from-origin\r\n"
      "Connection: close\r\n\r\nok\n");
  (void)(*tls)->CloseWrite();
}

std::string TlsOrigin::Header(const std::string& head, const std::string& name) {
  std::string lower = AsciiLower(head);
  size_t at = lower.find("\r\n" + AsciiLower(name) + ":");
  if (at == std::string::npos) return "";
  size_t from = at + 3 + name.size();
  std::string v = head.substr(from, head.find("\r\n", from) - from);
  while (!v.empty() && v.front() == ' ') v.erase(0, 1);
  return v;
}

// One smart-HTTP request through git http-backend; the whole response, Connection: close.
std::string TlsOrigin::Git(egress::TlsStream& tls, std::string buffered) {
  if (Header(buffered, "authorization") != git_auth_) {
    return "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"forge\"\r\n"
           "Content-Length: 0\r\nConnection: close\r\n\r\n";
  }
  size_t end = buffered.find("\r\n\r\n") + 4;
  std::string line = buffered.substr(0, buffered.find("\r\n"));
  std::string method = line.substr(0, line.find(' '));
  std::string target = line.substr(line.find(' ') + 1);
  target = target.substr(0, target.find(' '));
  std::string path = target.substr(4, target.find('?') - 4);  // after "/git"
  std::string query =
      target.find('?') == std::string::npos ? "" : target.substr(target.find('?') + 1);
  size_t length = static_cast<size_t>(std::atoll(Header(buffered, "content-length").c_str()));
  std::string body = buffered.substr(end);
  while (body.size() < length) {
    auto more = tls.Read(65536, Clock::now() + std::chrono::seconds(30));
    if (!more.ok() || more->empty()) return "";
    body += *more;
  }
  auto dir = TempDir::Make(::testing::TempDir(), "git_cgi");
  if (!dir.ok()) return "";
  const std::string in = dir->path() + "/in", out = dir->path() + "/out";
  if (!WriteFileAtomic(in, body).ok()) return "";
  auto in_fd = OpenFile(in, O_RDONLY);
  auto out_fd = OpenFile(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (!in_fd.ok() || !out_fd.ok()) return "";
  SpawnOptions o;
  o.argv = {"git", "http-backend"};
  o.env = std::vector<std::string>{"PATH=/usr/bin:/bin",
                                   "GIT_PROJECT_ROOT=" + git_root_,
                                   "GIT_HTTP_EXPORT_ALL=1",
                                   "REQUEST_METHOD=" + method,
                                   "PATH_INFO=" + path,
                                   "QUERY_STRING=" + query,
                                   "CONTENT_TYPE=" + Header(buffered, "content-type"),
                                   "CONTENT_LENGTH=" + std::to_string(body.size()),
                                   "HTTP_CONTENT_ENCODING=" + Header(buffered, "content-encoding"),
                                   "GIT_PROTOCOL=" + Header(buffered, "git-protocol"),
                                   "REMOTE_USER=x-access-token",
                                   "REMOTE_ADDR=127.0.0.1"};
  o.stdin_fd = in_fd->get();
  o.stdout_fd = out_fd->get();
  auto child = ChildProcess::Spawn(o);
  if (!child.ok() || !child->WaitFor(std::chrono::seconds(60)).ok()) return "";
  auto cgi = ReadFileToString(out);
  if (!cgi.ok()) return "";
  size_t split = cgi->find("\r\n\r\n");
  size_t skip = 4;
  if (split == std::string::npos) {
    split = cgi->find("\n\n");
    skip = 2;
  }
  if (split == std::string::npos) return "";
  std::string status = "200 OK", headers;
  std::string cgi_head = cgi->substr(0, split) + "\n";
  for (size_t at = 0; at < cgi_head.size();) {
    size_t nl = cgi_head.find('\n', at);
    std::string h = cgi_head.substr(at, nl - at);
    if (!h.empty() && h.back() == '\r') h.pop_back();
    at = nl + 1;
    if (h.empty()) continue;
    if (h.rfind("Status:", 0) == 0) {
      status = h.substr(h.find_first_not_of(' ', 7));
    } else {
      headers += h + "\r\n";
    }
  }
  std::string payload = cgi->substr(split + skip);
  return "HTTP/1.1 " + status + "\r\n" + headers +
         "Content-Length: " + std::to_string(payload.size()) + "\r\nConnection: close\r\n\r\n" +
         payload;
}

Status ServeOriginsByName(Harness& h, const egress::CertAuthority& ca,
                          const std::vector<std::pair<std::string, uint16_t>>& origins) {
  RETURN_IF_ERROR(h.StopDaemon());
  RETURN_IF_ERROR(MakeDirs(h.home() + "/config", 0700));
  const std::string ca_file = h.home() + "/config/upstream-ca.pem";
  RETURN_IF_ERROR(WriteFileAtomic(ca_file, ca.cert_pem()));
  nlohmann::json resolve = nlohmann::json::object(), internal = nlohmann::json::array();
  for (const auto& [name, port] : origins) {
    resolve[name] = {"127.0.0.1"};
    internal.push_back("127.0.0.1:" + std::to_string(port));
  }
  nlohmann::json config = {
      {"resolve", resolve}, {"internal_allow", internal}, {"upstream_ca_file", ca_file}};
  RETURN_IF_ERROR(WriteFileAtomic(h.home() + "/config/egress.json", config.dump()));
  return h.RestartDaemon();
}

CliResult ShIn(Harness& h, const std::string& id, const std::string& script) {
  return h.Cli({"exec", id, "--", "bash", "-c", script});
}

std::string OriginUrl(const TlsOrigin& o, const std::string& host, const std::string& path) {
  return "https://" + host + ":" + std::to_string(o.port()) + path;
}

std::string GuestPlaceholder(Harness& h, const std::string& id, const std::string& name) {
  CliResult r = ShIn(h, id, "printf %s \"$" + name + "\"");
  EXPECT_EQ(r.code, 0) << r.err;
  return r.out;
}

bool HasField(const std::string& head, const std::string& name, const std::string& value) {
  size_t at = head.find("\r\n");
  while (at != std::string::npos) {
    at += 2;
    size_t eol = std::min(head.find("\r\n", at), head.size());
    size_t colon = head.find(':', at);
    if (colon < eol && AsciiEqualsIgnoreCase(head.substr(at, colon - at), name)) {
      std::string v = head.substr(colon + 1, eol - colon - 1);
      while (!v.empty() && v.front() == ' ') v.erase(0, 1);
      if (v == value) return true;
    }
    at = eol == head.size() ? std::string::npos : eol;
  }
  return false;
}

int64_t CountInFile(const std::string& path, const std::string& needle) {
  auto fd = OpenFile(path, O_RDONLY);
  if (!fd.ok()) return -1;
  int64_t hits = 0;
  std::string carry;
  std::string block(8 << 20, '\0');
  for (;;) {
    auto n = ReadSome(fd->get(), block.data(), block.size());
    if (!n.ok()) return -1;
    if (*n == 0) break;
    std::string hay = carry + block.substr(0, *n);
    for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) {
      ++hits;
    }
    size_t keep = std::min(hay.size(), needle.size() - 1);
    carry = hay.substr(hay.size() - keep);
  }
  return hits;
}

void ExpectValueNowhereButPlaceholderFound(const Harness& h, const std::string& id,
                                           const std::vector<std::string>& forms,
                                           const std::string& placeholder, int64_t min_dump_bytes) {
  ASSERT_FALSE(forms.empty());
  const std::string& value = forms.front();
  std::string vm_dir = h.vms_dir() + "/" + id;
  auto dump_dir = TempDir::Make("/tmp", "tbx-memdump-");
  ASSERT_TRUE(dump_dir.ok()) << dump_dir.status().ToString();
  std::string dump = dump_dir->path() + "/guest.mem";
  {
    auto out = OpenFile(dump, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_TRUE(out.ok());
    auto qmp = vmm::Qmp::Connect(vm_dir + "/qmp.sock", Clock::now() + std::chrono::seconds(30));
    ASSERT_TRUE(qmp.ok()) << qmp.status().ToString();
    ASSERT_TRUE(qmp->Execute("getfd", {{"fdname", "memdump"}}, out->get()).ok());
    auto done = qmp->Execute("dump-guest-memory", {{"paging", false}, {"protocol", "fd:memdump"}});
    ASSERT_TRUE(done.ok()) << done.status().ToString();
  }
  struct stat st {};
  ASSERT_EQ(::stat(dump.c_str(), &st), 0);
  EXPECT_GT(st.st_size, min_dump_bytes) << "the dump does not hold the guest's memory";
  for (const std::string& form : forms) {
    EXPECT_EQ(CountInFile(dump, form), 0) << "a form of the value is in the guest's memory";
  }
  EXPECT_GT(CountInFile(dump, placeholder), 0) << "the search cannot find even the placeholder";
  // The VM's disk layer: every file of its directory (overlay, transfer disk...).
  std::vector<std::string> files = ListDir(vm_dir).value_or(std::vector<std::string>{});
  int64_t ph_on_disk = 0;
  for (const auto& f : files) {
    std::string path = vm_dir + "/" + f;
    struct stat fs {};
    if (::stat(path.c_str(), &fs) != 0 || !S_ISREG(fs.st_mode)) continue;
    EXPECT_EQ(CountInFile(path, value), 0) << path;
    ph_on_disk += std::max<int64_t>(0, CountInFile(path, placeholder));
  }
  EXPECT_GT(ph_on_disk, 0) << "the disk search cannot find even the placeholder";
  // The trusted side's records. The log (the harness's capture of the daemon's stderr) and
  // the store must exist, so that a moved file cannot make this pass unsearched; the WAL may
  // have been checkpointed away.
  for (const std::string& path : {h.home() + "/tryboxd.log", h.home() + "/state/trybox.db"}) {
    EXPECT_EQ(CountInFile(path, value), 0) << path;
  }
  const std::string wal = h.home() + "/state/trybox.db-wal";
  struct stat ws {};
  if (::stat(wal.c_str(), &ws) == 0) {
    EXPECT_EQ(CountInFile(wal, value), 0) << wal;
  }
}

}  // namespace trybox::e2e
