#include "guest/cmdline.h"

#include <cctype>

#include "util/ascii.h"
#include "util/names.h"

namespace trybox::guest {
namespace {

std::string NormalizeModuleName(std::string_view name) {
  std::string out(name);
  for (char& c : out) {
    if (c == '-') c = '_';
  }
  return out;
}

std::vector<std::string> SplitCmdline(std::string_view text) {
  std::vector<std::string> out;
  std::string cur;
  bool in_token = false, quoted = false;
  for (char c : text) {
    if (c == '"') {
      quoted = !quoted;
      in_token = true;
      continue;
    }
    if (!quoted && std::isspace(static_cast<unsigned char>(c))) {
      if (in_token) out.push_back(std::move(cur));
      cur.clear();
      in_token = false;
      continue;
    }
    cur += c;
    in_token = true;
  }
  if (in_token) out.push_back(std::move(cur));
  return out;
}

}  // namespace

bool ValidHostname(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  size_t label_start = 0;
  for (size_t i = 0; i <= name.size(); ++i) {
    if (i == name.size() || name[i] == '.') {
      std::string_view label = name.substr(label_start, i - label_start);
      if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
        return false;
      }
      label_start = i + 1;
      continue;
    }
    char c = name[i];
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
  }
  return true;
}

std::optional<std::string> NormalizeMachineId(std::string_view value) {
  if (value.size() != 32 ||
      value.find_first_not_of("0123456789abcdefABCDEF") != std::string_view::npos ||
      value.find_first_not_of('0') == std::string_view::npos) {
    return std::nullopt;
  }
  return AsciiLower(value);
}

KernelCmdline ParseKernelCmdline(std::string_view text) {
  KernelCmdline out;
  for (std::string& token : SplitCmdline(text)) {
    // Everything after a lone "--" is for init's argv, not parameters.
    if (token == "--") break;
    size_t eq = token.find('=');
    std::string key = token.substr(0, eq);
    std::string value = eq == std::string::npos ? "" : token.substr(eq + 1);
    if (key == "trybox.probe") {
      out.probe = value == "1";
    } else if (key == "trybox.hostname") {
      if (ValidHostname(value)) {
        out.hostname = value;
      } else {
        out.problems.push_back("ignoring trybox.hostname=" + QuoteForMessage(value) +
                               ": not a valid hostname");
      }
    } else if (key == "trybox.machine_id") {
      if (auto id = NormalizeMachineId(value)) {
        out.machine_id = *id;
      } else {
        out.problems.push_back("ignoring trybox.machine_id=" + QuoteForMessage(value) +
                               ": not 32 hex digits");
      }
    } else if (key == "trybox.template") {
      out.template_boot = value == "1";
    } else if (key == "trybox.layers") {
      // As many as the host's image format allows (image.h, kMaxLayers).
      if (value.size() <= 2 && !value.empty() &&
          value.find_first_not_of("0123456789") == std::string::npos && std::stoi(value) >= 1 &&
          std::stoi(value) <= 16) {
        out.layers = std::stoi(value);
      } else {
        out.problems.push_back("ignoring trybox.layers=" + QuoteForMessage(value) +
                               ": not a number from 1 to 16");
      }
    }
    out.params.emplace_back(std::move(key), std::move(value));
  }
  return out;
}

std::string ModuleParams(const KernelCmdline& cmdline, std::string_view module) {
  std::string want = NormalizeModuleName(module) + ".";
  std::string out;
  for (const auto& [key, value] : cmdline.params) {
    size_t dot = key.find('.');
    if (dot == std::string::npos || dot + 1 == key.size()) continue;
    if (NormalizeModuleName(key.substr(0, dot + 1)) != want) continue;
    if (!out.empty()) out += ' ';
    out += key.substr(dot + 1);
    if (!value.empty()) {
      bool needs_quotes = value.find(' ') != std::string::npos;
      out += needs_quotes ? "=\"" + value + "\"" : "=" + value;
    }
  }
  return out;
}

std::string ModuleNameFromPath(std::string_view path) {
  size_t slash = path.rfind('/');
  std::string_view base = slash == std::string_view::npos ? path : path.substr(slash + 1);
  size_t ko = base.find(".ko");
  if (ko != std::string_view::npos) base = base.substr(0, ko);
  return NormalizeModuleName(base);
}

}  // namespace trybox::guest
