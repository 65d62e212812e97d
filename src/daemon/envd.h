// The in-sandbox API's services beyond the process service (docs/protocol/e2b.md,
// "In-sandbox API"): envd's filesystem service and `GET /files`, each request carried out
// by an exec in the guest as the request's account, so that the guest's own permissions
// decide what an account may see and change, as envd's do. Each is recorded like any exec.
#pragma once

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "api/router.h"
#include "daemon/vm_service.h"

namespace trybox::daemon {

// The most `GET /files` returns and `POST /files` takes; larger files are refused (use
// `trybox cp`).
inline constexpr size_t kMaxFileReadBytes = size_t{64} << 20;
inline constexpr size_t kMaxFileWriteBytes = size_t{64} << 20;

// The entries below directory `path` of VM `vm` to `depth` levels, as `user` ("" or "root":
// root) sees them, in envd's shape ({name, type, path, size, mode, permissions, owner,
// group, modifiedTime, symlinkTarget?}); a relative path is from the account's home.
// NOT_FOUND, INVALID_ARGUMENT for a path that is not a directory, RESOURCE_EXHAUSTED past
// 16 MiB of listing.
Result<nlohmann::json> ListDirAs(VmService& vms, const std::string& vm, const std::string& user,
                                 const std::string& path, int64_t depth = 1);
// The content of file `path`, read as `user`; RESOURCE_EXHAUSTED past kMaxFileReadBytes.
Result<std::string> ReadFileAs(VmService& vms, const std::string& vm, const std::string& user,
                               const std::string& path);

// `stop`: set while the server stops; a watch's stream then ends within a second.
void AddFilesystemRoutes(api::Router& router, VmService& vms, const std::atomic<bool>& stop);

// A streaming call that fails before its first message: HTTP 200 and only the end of the
// stream, carrying the error, as the Connect protocol has it.
api::HttpResponse EnvdStreamError(const Status& st);
// The keepalive interval a streaming call asks for (`Keepalive-Ping-Interval`, 1 to 3600
// seconds; 50, the SDK's, when absent or malformed).
std::chrono::seconds EnvdKeepalive(const api::HttpRequest& req);

// The account an in-sandbox request acts as: envd's `Authorization: Basic base64(USER:)`,
// else `fallback` (a `username` query parameter, for /files), else E2B's default "user".
Result<std::string> EnvdUser(const api::HttpRequest& req, const std::string& fallback = "");

}  // namespace trybox::daemon
