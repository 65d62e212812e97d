#include "bench/baseline.h"

#include <algorithm>
#include <cstdio>

#include "util/fd.h"
#include "util/json.h"

namespace trybox::bench {
namespace {

using Json = nlohmann::json;

Json FigureJson(const Figure& f) {
  return {{"value", f.value},
          {"unit", f.unit},
          {"better", f.lower_is_better ? "lower" : "higher"},
          {"what", f.what}};
}

Figure FigureFrom(const std::string& name, const Json& j) {
  Figure f;
  f.name = name;
  f.value = NumOr(j, "value");
  f.unit = StrOr(j, "unit");
  f.lower_is_better = StrOr(j, "better", "lower") != "higher";
  f.what = StrOr(j, "what", name);
  return f;
}

std::string Format(double v, const std::string& unit) {
  char buf[64];
  std::snprintf(buf, sizeof buf,
                v >= 100  ? "%.0f %s"
                : v >= 10 ? "%.1f %s"
                          : "%.2f %s",
                v, unit.c_str());
  return buf;
}

}  // namespace

Status FiguresFile::Write() const {
  if (path_.empty()) return Status::Ok();
  Json list = Json::array();
  for (const auto& f : figures_) {
    Json j = FigureJson(f);
    j["name"] = f.name;
    list.push_back(j);
  }
  return WriteFileAtomic(path_, Json{{"figures", list}, {"load", LoadAverage()}}.dump(1) + "\n");
}

double WorseBy(const Figure& now, double base) {
  if (!(now.value > 0) || !(base > 0)) return 0;
  return now.lower_is_better ? now.value / base : base / now.value;
}

Result<std::vector<Figure>> ReadFigures(const std::vector<std::string>& paths) {
  std::vector<Figure> out;
  for (const auto& p : paths) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(p));
    Json j = Json::parse(text, nullptr, false);
    if (!j.is_object() || !j.contains("figures") || !j["figures"].is_array()) {
      return InvalidArgument(p + ": not a figures file (no \"figures\" array)");
    }
    for (const auto& e : j["figures"]) {
      std::string name = StrOr(e, "name");
      if (name.empty()) return InvalidArgument(p + ": a figure without a name");
      Figure f = FigureFrom(name, e);
      auto same =
          std::find_if(out.begin(), out.end(), [&](const Figure& o) { return o.name == name; });
      if (same != out.end()) {
        *same = f;
      } else {
        out.push_back(f);
      }
    }
  }
  return out;
}

Result<Baseline> ReadBaseline(const std::string& path) {
  Baseline b;
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    if (text.status().code() == Code::kNotFound) return b;
    return text.status();
  }
  Json j = Json::parse(*text, nullptr, false);
  if (!j.is_object()) return InvalidArgument(path + ": not a JSON object");
  b.recorded = StrOr(j, "recorded");
  b.reason = StrOr(j, "reason");
  b.load = StrOr(j, "load");
  if (j.contains("figures") && j["figures"].is_object()) {
    for (const auto& [name, f] : j["figures"].items()) b.figures[name] = FigureFrom(name, f);
  }
  return b;
}

std::optional<double> MachineFactor(const std::vector<Figure>& now, const Baseline& base) {
  std::optional<double> qga_now;
  for (const auto& f : now) {
    if (f.name == kQgaRoundTrip && f.value > 0) qga_now = f.value;
  }
  std::optional<double> qga_then;
  if (auto it = base.figures.find(kQgaRoundTrip); it != base.figures.end()) {
    qga_then = it->second.value;
  } else {
    auto ratio = base.figures.find("exec.qga_ratio");
    auto rt = base.figures.find("exec.round_trip_p50_ms");
    if (ratio != base.figures.end() && rt != base.figures.end()) {
      qga_then = ratio->second.value * rt->second.value;
    }
  }
  if (!qga_now || !qga_then || *qga_then <= 0) return std::nullopt;
  return *qga_now / *qga_then;
}

std::string CompareTable(const std::vector<Figure>& now, const Baseline& base, int* worse) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-52s %14s %14s %8s\n", "figure", "now", "baseline", "factor");
  out += line;
  int marked = 0;
  for (const auto& f : now) {
    auto it = base.figures.find(f.name);
    std::string b = it == base.figures.end() ? "-" : Format(it->second.value, it->second.unit);
    double by = it == base.figures.end() ? 0 : WorseBy(f, it->second.value);
    std::string factor = by > 0 ? Format(by, "x") : "";
    std::string mark;
    const bool peer = f.name.rfind(kPeerPrefix, 0) == 0;
    if (by > kWorseFactor && !peer) {
      mark = "  WORSE";
      ++marked;
    }
    std::string what = f.what.size() > 52 ? f.what.substr(0, 49) + "..." : f.what;
    std::snprintf(line, sizeof line, "%-52s %14s %14s %8s%s\n", what.c_str(),
                  Format(f.value, f.unit).c_str(), b.c_str(), factor.c_str(), mark.c_str());
    out += line;
  }
  if (auto m = MachineFactor(now, base)) {
    std::snprintf(line, sizeof line,
                  "machine: qemu-guest-agent's own exec round trip (no trybox code on its path) "
                  "is %.2fx the baseline's:\n  this machine runs guests %.2fx %s; a figure that "
                  "moved by about that much moved with the machine\n",
                  *m, *m >= 1 ? *m : 1 / *m, *m >= 1 ? "slower" : "faster");
    out += line;
  }
  if (worse) *worse = marked;
  return out;
}

Status Record(const std::string& path, const std::vector<Figure>& now, const std::string& reason,
              const std::string& load, const std::string& date) {
  if (reason.empty()) return InvalidArgument("the baseline is recorded only with a reason");
  if (now.empty()) return InvalidArgument("no figures to record");
  Json figures = Json::object();
  for (const auto& f : now) figures[f.name] = FigureJson(f);
  Json j = {{"recorded", date}, {"reason", reason}, {"load", load}, {"figures", figures}};
  return WriteFileAtomic(path, j.dump(2) + "\n");
}

std::string LoadAverage() {
  auto text = ReadFileToString("/proc/loadavg");
  if (!text.ok()) return "";
  // "0.52 0.58 0.59 1/467 12345": the first three fields.
  size_t end = 0;
  for (int i = 0; i < 3 && end != std::string::npos; ++i) end = text->find(' ', end + 1);
  return text->substr(0, end);
}

}  // namespace trybox::bench
