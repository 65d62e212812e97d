// The in-sandbox API's services beyond the process service (docs/protocol/e2b.md,
// "In-sandbox API"): envd's filesystem service and `GET /files`, each request carried out
// by an exec in the guest as the request's account, so that the guest's own permissions
// decide what an account may see and change, as envd's do. Each is recorded like any exec.
#pragma once

#include <string>

#include "api/router.h"
#include "daemon/vm_service.h"

namespace trybox::daemon {

// The most `GET /files` returns and `POST /files` takes; larger files are refused (use
// `trybox cp`).
inline constexpr size_t kMaxFileReadBytes = size_t{64} << 20;
inline constexpr size_t kMaxFileWriteBytes = size_t{64} << 20;

void AddFilesystemRoutes(api::Router& router, VmService& vms);

// The account an in-sandbox request acts as: envd's `Authorization: Basic base64(USER:)`,
// else `fallback` (a `username` query parameter, for /files), else E2B's default "user".
Result<std::string> EnvdUser(const api::HttpRequest& req, const std::string& fallback = "");

}  // namespace trybox::daemon
