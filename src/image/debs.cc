#include "image/debs.h"

#include <unistd.h>

#include <sstream>

#include "image/build.h"
#include "util/fd.h"
#include "util/process.h"

namespace trybox::image {
namespace {

std::string Tail(const std::string& s, size_t n = 2000) {
  return s.size() > n ? s.substr(s.size() - n) : s;
}

Result<std::string> Apt(const std::vector<std::string>& argv) {
  ASSIGN_OR_RETURN(CommandResult r, RunCommand(argv));
  if (!r.exit.exited || r.exit.code != 0) {
    return FailedPrecondition("apt-get failed (" + r.exit.Describe() + "): " + Tail(r.output));
  }
  return r.output;
}

// A package name, version or architecture as it appears in a file name; apt writes an
// epoch's ':' as %3a.
std::string EscapeForFileName(std::string v) {
  for (size_t p; (p = v.find(':')) != std::string::npos;) v.replace(p, 1, "%3a");
  return v;
}

bool SafeComponent(const std::string& s) {
  if (s.empty() || s[0] == '.' || s[0] == '-') return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '+' || c == '-' || c == '.' || c == '~' || c == ':' || c == '_';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

Result<std::vector<DebToInstall>> ParseAptSimulation(const std::string& output) {
  std::vector<DebToInstall> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Inst ", 0) != 0) continue;
    // Inst NAME [OLDVERSION] (VERSION REPO... [ARCH])
    std::istringstream t(line.substr(5));
    DebToInstall d;
    t >> d.package;
    const size_t open = line.find(" (");
    // The arch is the last [..] inside the parentheses; apt may append " []" after them.
    const size_t close = line.find(')', open == std::string::npos ? 0 : open);
    const size_t arch_open = close == std::string::npos ? close : line.rfind('[', close);
    const size_t arch_close = close == std::string::npos ? close : line.rfind(']', close);
    if (d.package.empty() || open == std::string::npos || arch_open == std::string::npos ||
        arch_close == std::string::npos || arch_close < arch_open || arch_open < open) {
      return Internal("unexpected apt-get -s line: " + line);
    }
    std::istringstream v(line.substr(open + 2));
    v >> d.version;
    d.arch = line.substr(arch_open + 1, arch_close - arch_open - 1);
    if (!SafeComponent(d.package) || !SafeComponent(d.version) || !SafeComponent(d.arch)) {
      return Internal("unexpected apt-get -s line: " + line);
    }
    d.file = d.package + "_" + EscapeForFileName(d.version) + "_" + d.arch + ".deb";
    out.push_back(std::move(d));
  }
  return out;
}

Result<FetchedDebs> FetchDebs(const FetchDebsOptions& opts) {
  ASSIGN_OR_RETURN(AptSources sources, FindAptSources(opts.apt_dir, opts.suite));
  const std::string apt = opts.cache_dir + "/apt";
  ASSIGN_OR_RETURN(TempDir tmp, TempDir::Make(opts.cache_dir + "/tmp", "debs-"));
  for (const std::string& d : {apt + "/lists/partial", apt + "/archives/partial",
                               tmp.path() + "/state", tmp.path() + "/parts"}) {
    RETURN_IF_ERROR(MakeDirs(d));
  }
  // The host's apt configuration (proxies, keyrings) applies; its state, sources and
  // dpkg status are replaced: the lists and .debs are ours, the status is the guest's.
  std::vector<std::string> base = {"apt-get", "-q",
                                   "-o",      "Dir::State=" + tmp.path() + "/state",
                                   "-o",      "Dir::State::Lists=" + apt + "/lists",
                                   "-o",      "Dir::State::status=" + opts.dpkg_status,
                                   "-o",      "Dir::Cache=" + apt,
                                   "-o",      "Dir::Cache::pkgcache=",
                                   "-o",      "Dir::Cache::srcpkgcache=",
                                   "-o",      "Dir::Etc::SourceList=" + sources.path,
                                   "-o",      "Dir::Etc::SourceParts=" + tmp.path() + "/parts",
                                   "-o",      "Debug::NoLocking=1",
                                   "-o",      "APT::Sandbox::User=root",
                                   "-o",      "APT::Install-Recommends=false"};
  auto with = [&](std::vector<std::string> tail) {
    std::vector<std::string> a = base;
    a.insert(a.end(), tail.begin(), tail.end());
    return a;
  };
  if (opts.progress) opts.progress("apt-get update (" + sources.path + ")");
  RETURN_IF_ERROR(Apt(with({"update"})).status());
  std::vector<std::string> install = {"install", "-y"};
  install.insert(install.end(), opts.packages.begin(), opts.packages.end());
  std::vector<std::string> simulate = install;
  simulate.insert(simulate.begin() + 1, "-s");
  ASSIGN_OR_RETURN(std::string sim, Apt(with(simulate)));
  FetchedDebs out;
  out.archives = apt + "/archives";
  ASSIGN_OR_RETURN(out.debs, ParseAptSimulation(sim));
  if (out.debs.empty()) return out;
  if (opts.progress) {
    opts.progress("apt-get download: " + std::to_string(out.debs.size()) + " packages");
  }
  install.insert(install.begin() + 1, "--download-only");
  RETURN_IF_ERROR(Apt(with(install)).status());
  for (const auto& d : out.debs) {
    if (::access((out.archives + "/" + d.file).c_str(), R_OK) != 0) {
      return Internal("apt-get did not download " + d.file);
    }
  }
  return out;
}

}  // namespace trybox::image
