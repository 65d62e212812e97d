#include "api/router.h"

namespace trybox::api {

std::vector<std::string> SplitPath(const std::string& path) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    if (slash > start) out.push_back(path.substr(start, slash - start));
    start = slash + 1;
  }
  return out;
}

void Router::Add(const std::string& method, const std::string& pattern, RouteHandler handler) {
  routes_.push_back({method, SplitPath(pattern), std::move(handler)});
}

namespace {

bool Match(const std::vector<std::string>& pattern, const std::vector<std::string>& path,
           PathParams* params) {
  if (pattern.size() != path.size()) return false;
  PathParams found;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const std::string& p = pattern[i];
    if (p.size() > 2 && p.front() == '{' && p.back() == '}') {
      found[p.substr(1, p.size() - 2)] = path[i];
    } else if (p != path[i]) {
      return false;
    }
  }
  *params = std::move(found);
  return true;
}

}  // namespace

HttpResponse Router::Dispatch(const HttpRequest& req) const {
  const std::vector<std::string> path = SplitPath(req.path);
  std::string allow;
  for (const Route& r : routes_) {
    PathParams params;
    if (!Match(r.segments, path, &params)) continue;
    if (r.method == req.method) return r.handler(req, params);
    if (allow.find(r.method) == std::string::npos) allow += (allow.empty() ? "" : ", ") + r.method;
  }
  if (allow.empty()) return JsonError(404, "no route " + req.method + " " + req.path);
  HttpResponse r =
      JsonError(405, req.method + " is not allowed on " + req.path + "; allowed: " + allow);
  r.headers.emplace_back("Allow", allow);
  return r;
}

}  // namespace trybox::api
