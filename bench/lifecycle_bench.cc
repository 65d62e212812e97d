// Lifecycle benchmarks (issue 2). Prints figures; asserts nothing. Restores from templates
// have their own bench (template_bench.cc); the first figure here boots cold.
//
//   cold create -> first exec reply   p50/p99 over N VMs
//   exec round trip of `true`         p50/p99, trybox vs qemu-guest-agent guest-exec
//   stdout streaming                  MB/s, trybox vs qemu-guest-agent (same guest, same run)
//   put / get                         MB/s
//   `trybox exec ID -- true`          p50 through the CLI binary, beside the API's
//
// Usage: lifecycle_bench [--vms N] [--execs N] [--stream-mib N] [--file-mib N] [--quick]
//                        [--figures FILE]   (headline figures as JSON, for scripts/bench.sh)
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/baseline.h"
#include "bench/bench_util.h"
#include "cli/client.h"
#include "cli/transfer.h"
#include "tests/e2e/harness.h"
#include "util/socket.h"

using trybox::Result;
using trybox::Status;
using Json = nlohmann::json;
using Clock = trybox::bench::Clock;
using Kind = trybox::channel::Stream::Message::Kind;

namespace {

using trybox::bench::Die;
using trybox::bench::Ms;
using trybox::bench::Pct;

// Runs argv in the VM; returns stdout bytes, and the outcome in *result.
uint64_t Exec(trybox::cli::Client& c, const std::string& vm, const std::vector<std::string>& argv,
              Json* result) {
  auto s = c.Open({{"verb", "exec"}, {"vm", vm}, {"argv", argv}});
  if (!s.ok()) Die("exec", s.status());
  uint64_t bytes = 0;
  for (;;) {
    auto m = (*s)->Next();
    if (!m.ok()) Die("exec", m.status());
    if (m->kind == Kind::kData) bytes += m->data.size();
    if (m->kind == Kind::kEnd) {
      if (result) *result = m->body;
      return bytes;
    }
  }
}

std::string Create(trybox::cli::Client& c, bool cold = false) {
  auto r = c.Call({{"verb", "create"}, {"image", "debian-12"}, {"cold", cold}});
  if (!r.ok()) Die("create", r.status());
  return (*r)["vm"]["id"];
}

// A minimal qemu-guest-agent client: JSON commands on the VM's org.qemu.guest_agent.0 port.
class Qga {
 public:
  explicit Qga(trybox::UniqueFd fd) : fd_(std::move(fd)) {}
  Result<Json> Call(const Json& cmd) {
    std::string line = cmd.dump();
    RETURN_IF_ERROR(trybox::WriteFull(fd_.get(), line));
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string one = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        Json j = Json::parse(one, nullptr, false);
        if (j.is_discarded()) continue;
        if (j.contains("error")) return trybox::Internal("qga: " + j["error"].dump());
        return j["return"];
      }
      char tmp[65536];
      ASSIGN_OR_RETURN(size_t n, trybox::ReadSome(fd_.get(), tmp, sizeof tmp));
      if (n == 0) return trybox::Unavailable("qga closed");
      buf_.append(tmp, n);
    }
  }
  // Runs to completion, polling guest-exec-status as fast as it answers; returns out bytes.
  Result<uint64_t> Exec(const std::string& path, const std::vector<std::string>& args) {
    ASSIGN_OR_RETURN(
        Json started,
        Call({{"execute", "guest-exec"},
              {"arguments", {{"path", path}, {"arg", args}, {"capture-output", true}}}}));
    int pid = started["pid"];
    for (;;) {
      ASSIGN_OR_RETURN(Json st,
                       Call({{"execute", "guest-exec-status"}, {"arguments", {{"pid", pid}}}}));
      if (st.value("exited", false)) {
        std::string b64 = st.value("out-data", "");
        return static_cast<uint64_t>(b64.size() / 4 * 3);
      }
    }
  }

 private:
  trybox::UniqueFd fd_;
  std::string buf_;
};

}  // namespace

int main(int argc, char** argv) {
  int vms = 10, execs = 100, stream_mib = 256, file_mib = 256, qga_stream_mib = 16, cli_execs = 20,
      stream_reps = 3;
  std::string figures_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") {
      vms = 1;
      execs = 40;
      stream_mib = 64;
      file_mib = 64;
      qga_stream_mib = 4;
      cli_execs = 10;
      stream_reps = 3;
      continue;
    }
    if (i + 1 >= argc) break;
    const char* next = argv[++i];
    int v = std::atoi(next);
    if (a == "--vms") vms = v;
    if (a == "--execs") execs = v;
    if (a == "--stream-mib") stream_mib = v;
    if (a == "--file-mib") file_mib = v;
    if (a == "--qga-stream-mib") qga_stream_mib = v;
    if (a == "--cli-execs") cli_execs = v;
    if (a == "--stream-reps") stream_reps = v;
    if (a == "--figures") figures_path = next;
  }
  trybox::bench::FiguresFile figures(figures_path);
  std::printf("load: %s\n", trybox::bench::LoadAverage().c_str());
  auto h = trybox::e2e::Harness::Start();
  if (!h.ok()) Die("start tryboxd", h.status());
  ::setenv("TRYBOX_HOME", (*h)->home().c_str(), 1);
  auto client = trybox::cli::Client::Connect(trybox::Paths::FromEnvironment(), false);
  if (!client.ok()) Die("connect", client.status());
  auto& c = **client;
  auto doc = c.Call({{"verb", "doctor"}});
  std::printf("accel: %s (%s)\n", (*doc)["accel"]["accel"].dump().c_str(),
              (*doc)["accel"]["reason"].get<std::string>().c_str());

  // 1. Cold create -> first exec reply.
  std::vector<double> cold;
  for (int i = 0; i < vms; ++i) {
    auto t0 = Clock::now();
    std::string id = Create(c, /*cold=*/true);
    Json r;
    Exec(c, id, {"true"}, &r);
    cold.push_back(Ms(t0, Clock::now()));
    (void)c.Call({{"verb", "destroy"}, {"vm", id}});
  }
  std::printf("cold create -> first exec reply (n=%d): p50 %.0f ms  p99 %.0f ms\n", vms,
              Pct(cold, 50), Pct(cold, 99));

  std::string id = Create(c);
  // 2. Exec round trip, trybox.
  std::vector<double> rt, in_guest, transport;
  for (int i = 0; i < execs + 5; ++i) {
    auto t0 = Clock::now();
    Json r;
    Exec(c, id, {"/bin/true"}, &r);
    if (i >= 5) {
      rt.push_back(Ms(t0, Clock::now()));
      in_guest.push_back(r["result"].value("duration_ms", 0.0));
    }
  }
  // The transport alone: a request the guest answers without starting a process.
  for (int i = 0; i < execs + 5; ++i) {
    auto t0 = Clock::now();
    auto s = c.Open({{"verb", "get"}, {"vm", id}, {"path", "/etc/hostname"}});
    if (!s.ok()) Die("get", s.status());
    for (;;) {
      auto m = (*s)->Next();
      if (!m.ok()) Die("get", m.status());
      if (m->kind == Kind::kEnd) break;
    }
    if (i >= 5) transport.push_back(Ms(t0, Clock::now()));
  }
  // The same exec through the CLI binary: its start-up, connection and output handling.
  // Each is paired with an exec at the API right after it, so that what the CLI adds is
  // measured against the same moment's guest (the bound: 10 ms), and with /bin/true
  // started the same way: this process is large, and its fork alone costs more than a
  // shell's (the floor any program pays here, subtracted from the CLI's own share).
  std::vector<double> cli, cli_over_api, spawn_floor, cli_own;
  for (int i = 0; i < cli_execs + 2; ++i) {
    auto t = Clock::now();
    auto r = (*h)->Cli({"exec", id, "--", "/bin/true"});
    if (r.code != 0) Die("trybox exec", trybox::Internal("exit " + std::to_string(r.code) + r.err));
    double cli_ms = Ms(t, Clock::now());
    t = Clock::now();
    Json api;
    Exec(c, id, {"/bin/true"}, &api);
    double api_ms = Ms(t, Clock::now());
    t = Clock::now();
    (void)trybox::e2e::RunProgram({"/bin/true"}, (*h)->Env());
    double floor_ms = Ms(t, Clock::now());
    if (i >= 2) {
      cli.push_back(cli_ms);
      cli_over_api.push_back(cli_ms - api_ms);
      spawn_floor.push_back(floor_ms);
      cli_own.push_back(cli_ms - api_ms - floor_ms);
    }
  }
  // 3. Streaming: exec stdout, and the raw port's ceiling in the same guest (the same bytes
  // written straight to the qemu-guest-agent port, a virtio-serial port like trybox's own,
  // and read on the host), alternated so that both see the same load.
  const std::string vmdir_raw = (*h)->vms_dir() + "/" + id;
  auto raw_once = [&]() -> double {
    auto pfd = trybox::ConnectUnix(vmdir_raw + "/qga.sock");
    if (!pfd.ok()) return 0;
    uint64_t got = 0;
    const uint64_t want = static_cast<uint64_t>(stream_mib) << 20;
    std::thread reader([&] {
      std::vector<char> buf(1 << 20);
      while (got < want) {
        auto n = trybox::ReadSome(pfd->get(), buf.data(), buf.size());
        if (!n.ok() || *n == 0) break;
        got += *n;
      }
    });
    auto rt0 = Clock::now();
    Json pr;
    Exec(c, id,
         {"sh", "-c",
          "for p in /sys/class/virtio-ports/*; do [ \"$(cat $p/name)\" = "
          "org.qemu.guest_agent.0 ] && exec head -c " +
              std::to_string(stream_mib) + "M /dev/zero > /dev/$(basename $p); done; exit 1"},
         &pr);
    reader.join();
    if (got < want) return 0;
    return static_cast<double>(got) / 1e6 / (Ms(rt0, Clock::now()) / 1000);
  };
  std::vector<double> stream_rates, raw_rates, stream_ratios;
  for (int i = 0; i < stream_reps; ++i) {
    auto t0 = Clock::now();
    uint64_t streamed =
        Exec(c, id, {"head", "-c", std::to_string(stream_mib) + "M", "/dev/zero"}, nullptr);
    double rate = static_cast<double>(streamed) / 1e6 / (Ms(t0, Clock::now()) / 1000);
    double raw = raw_once();
    stream_rates.push_back(rate);
    if (raw > 0) {
      raw_rates.push_back(raw);
      stream_ratios.push_back(rate / raw);
    }
  }
  double trybox_stream = Pct(stream_rates, 50);
  double raw_port = Pct(raw_rates, 50);

  // 4. put/get.
  auto dir = trybox::TempDir::Make("/tmp", "tbx-bench-");
  std::string f = dir->path() + "/blob";
  (void)trybox::RunChecked(
      {"sh", "-c", "head -c " + std::to_string(file_mib) + "M /dev/urandom > " + f});
  auto t0 = Clock::now();
  auto put = trybox::cli::PutPath(c, id, f, "/root/blob");
  double put_s = Ms(t0, Clock::now()) / 1000;
  if (!put.ok()) Die("put", put.status());
  t0 = Clock::now();
  auto get = trybox::cli::GetPath(c, id, "/root/blob", dir->path() + "/back");
  double get_s = Ms(t0, Clock::now()) / 1000;
  if (!get.ok()) Die("get", get.status());
  double mb = static_cast<double>(file_mib) * 1048576 / 1e6;

  // 5. qemu-guest-agent in the same guest: start it through trybox, then talk to its port.
  Json r;
  Exec(c, id,
       {"sh", "-c",
        "for p in /sys/class/virtio-ports/*; do [ \"$(cat $p/name)\" = org.qemu.guest_agent.0 ] "
        "&& exec qemu-ga -d -m virtio-serial -p /dev/$(basename $p); done; exit 1"},
       &r);
  std::vector<double> qrt;
  double qga_stream = 0;
  std::string vmdir = (*h)->vms_dir() + "/" + id;
  auto qfd = trybox::ConnectUnix(vmdir + "/qga.sock");
  if (!qfd.ok() || r["result"].value("outcome", "") != "exited" ||
      r["result"].value("exit_code", 1) != 0) {
    std::printf("qemu-guest-agent: could not start in the guest (%s; %s)\n", r.dump().c_str(),
                qfd.ok() ? "port connected" : qfd.status().ToString().c_str());
  } else {
    Qga q(std::move(*qfd));
    // Sync first: the port may hold stale bytes from before qemu-ga opened it.
    for (int i = 0; i < 50; ++i) {
      auto s = q.Call({{"execute", "guest-sync"}, {"arguments", {{"id", 4242}}}});
      if (s.ok() && *s == 4242) break;
    }
    for (int i = 0; i < 25; ++i) {
      auto t = Clock::now();
      auto e = q.Exec("/bin/true", {});
      if (!e.ok()) Die("qga exec", e.status());
      if (i >= 5) qrt.push_back(Ms(t, Clock::now()));
    }
    t0 = Clock::now();
    auto e = q.Exec("/usr/bin/head", {"-c", std::to_string(qga_stream_mib) + "M", "/dev/zero"});
    if (!e.ok()) Die("qga stream", e.status());
    qga_stream = static_cast<double>(*e) / 1e6 / (Ms(t0, Clock::now()) / 1000);
  }
  (void)c.Call({{"verb", "destroy"}, {"vm", id}});

  std::printf("exec round trip of /bin/true (n=%d): trybox p50 %.2f ms p99 %.2f ms", execs,
              Pct(rt, 50), Pct(rt, 99));
  if (!qrt.empty()) {
    std::printf(" | qemu-guest-agent p50 %.2f ms p99 %.2f ms | ratio qga/trybox %.1fx",
                Pct(qrt, 50), Pct(qrt, 99), Pct(qrt, 50) / Pct(rt, 50));
  }
  std::printf(
      "\n  of which the guest's spawn-to-exit: p50 %.2f ms; transport round trip (get of "
      "a small file, no process): p50 %.2f ms p99 %.2f ms",
      Pct(in_guest, 50), Pct(transport, 50), Pct(transport, 99));
  std::printf("\nstdout streaming: trybox p50 %.0f MB/s (%d MiB x %d)", trybox_stream, stream_mib,
              stream_reps);
  if (raw_port > 0) {
    std::printf(" | raw port, same guest %.0f MB/s | ratio trybox/raw, p50 of %zu pairs %.2f",
                raw_port, stream_ratios.size(), Pct(stream_ratios, 50));
  }
  if (qga_stream > 0) {
    std::printf(" | qemu-guest-agent %.1f MB/s (%d MiB) | ratio trybox/qga %.0fx", qga_stream,
                qga_stream_mib, trybox_stream / qga_stream);
  }
  std::printf("\nput %.0f MB/s, get %.0f MB/s (%d MiB random file)\n", mb / put_s, mb / get_s,
              file_mib);
  std::printf(
      "trybox exec ID -- /bin/true through the CLI (n=%d): p50 %.2f ms; above an API exec "
      "right after it, p50 %.2f ms; /bin/true started the same way p50 %.2f ms; the CLI's own "
      "share (above both), p50 %.2f ms\n",
      cli_execs, Pct(cli, 50), Pct(cli_over_api, 50), Pct(spawn_floor, 50), Pct(cli_own, 50));
  std::printf("load: %s\n", trybox::bench::LoadAverage().c_str());

  figures.Lower("cold.create_first_exec_p50_ms", Pct(cold, 50), "ms",
                "cold create -> first exec reply, p50");
  figures.Lower("exec.round_trip_p50_ms", Pct(rt, 50), "ms", "exec round trip of /bin/true, p50");
  figures.Lower("exec.spawn_to_exit_p50_ms", Pct(in_guest, 50), "ms",
                "  of which the guest's spawn-to-exit, p50");
  figures.Lower("exec.transport_p50_ms", Pct(transport, 50), "ms",
                "transport round trip (get of a small file), p50");
  if (!qrt.empty()) {
    figures.Higher("exec.qga_ratio", Pct(qrt, 50) / Pct(rt, 50), "x",
                   "exec: qemu-guest-agent p50 / trybox p50");
    figures.Lower(trybox::bench::kQgaRoundTrip, Pct(qrt, 50), "ms",
                  "peer: qemu-guest-agent's exec round trip, p50");
  }
  figures.Lower("exec.cli_p50_ms", Pct(cli, 50), "ms", "trybox exec ID -- /bin/true (CLI), p50");
  figures.Lower("exec.cli_over_api_p50_ms", Pct(cli_over_api, 50), "ms",
                "  the CLI above the API, alternated pairs, p50");
  figures.Lower("exec.cli_own_p50_ms", Pct(cli_own, 50), "ms",
                "  of which the CLI's own (less starting /bin/true), p50");
  figures.Higher("stream.stdout_mb_s", trybox_stream, "MB/s", "exec stdout streaming");
  if (raw_port > 0) {
    figures.Higher("stream.stdout_vs_raw_port", Pct(stream_ratios, 50), "x",
                   "  exec stdout / the raw port's ceiling, same guest");
  }
  figures.Higher("files.put_mb_s", mb / put_s, "MB/s", "put (trybox cp in), one file");
  figures.Higher("files.get_mb_s", mb / get_s, "MB/s", "get (trybox cp out), one file");
  Status st = figures.Write();
  if (!st.ok()) Die("write figures", st);
  return 0;
}
