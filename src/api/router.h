// Router: a method and a path pattern to a handler. Patterns are literal segments and
// `{name}` segments, which match one non-empty segment and hand it to the handler. A path
// no pattern matches is 404; a path that matches under other methods is 405 with `Allow`.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "api/http_server.h"

namespace trybox::api {

using PathParams = std::map<std::string, std::string>;
using RouteHandler = std::function<HttpResponse(const HttpRequest&, const PathParams&)>;

class Router {
 public:
  void Add(const std::string& method, const std::string& pattern, RouteHandler handler);
  HttpResponse Dispatch(const HttpRequest& req) const;

 private:
  struct Route {
    std::string method;
    std::vector<std::string> segments;
    RouteHandler handler;
  };
  std::vector<Route> routes_;
};

// The path's segments ("/a/b/" -> {"a", "b"}; empty segments dropped).
std::vector<std::string> SplitPath(const std::string& path);

}  // namespace trybox::api
