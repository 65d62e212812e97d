#include "api/http_server.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "api/connection_guard.h"
#include "api/peer.h"
#include "util/ascii.h"
#include "util/fd.h"
#include "util/log.h"
#include "util/numbers.h"

namespace trybox::api {
namespace {

// One request's state between libmicrohttpd's calls of the access handler.
struct Exchange {
  HttpRequest req;
  size_t limit = 0;                   // the body's limit for this request
  size_t received = 0;                // body bytes so far (multipart too)
  bool answered = false;              // a response was queued before the body was read (413)
  MHD_PostProcessor* form = nullptr;  // multipart/form-data only
  bool form_failed = false;
  ~Exchange() {
    if (form != nullptr) MHD_destroy_post_processor(form);
  }
};

// libmicrohttpd's post processor hands over each part of a form piece by piece.
MHD_Result FormPiece(void* cls, MHD_ValueKind, const char* key, const char* filename, const char*,
                     const char*, const char* data, uint64_t off, size_t size) {
  auto* ex = static_cast<Exchange*>(cls);
  const std::string field = key ? key : "";
  if (filename != nullptr) {
    auto& files = ex->req.files;
    // A new part starts at offset 0 (a part split over pieces continues the last one).
    // libmicrohttpd may announce a part with an empty piece at offset 0 and then give its
    // first bytes at offset 0 again: that is the same part.
    const bool same =
        !files.empty() && files.back().field == field && files.back().filename == filename;
    if (!same || (off == 0 && !files.back().data.empty())) {
      files.push_back({field, filename, ""});
    }
    files.back().data.append(data, size);
  } else {
    ex->req.form[field].append(data, size);
  }
  return MHD_YES;
}

std::string PeerOf(MHD_Connection* c) {
  const MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  if (info == nullptr || info->client_addr == nullptr) return "";
  char host[INET6_ADDRSTRLEN] = {};
  const sockaddr* sa = info->client_addr;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "";
}

MHD_Result CollectInto(void* cls, MHD_ValueKind, const char* key, const char* value) {
  auto* out = static_cast<std::map<std::string, std::string>*>(cls);
  if (key != nullptr) out->emplace(key, value ? value : "");
  return MHD_YES;
}

MHD_Result CollectHeader(void* cls, MHD_ValueKind, const char* key, const char* value) {
  auto* out = static_cast<std::map<std::string, std::string>*>(cls);
  if (key != nullptr) out->emplace(AsciiLower(key), value ? value : "");
  return MHD_YES;
}

// A streamed body between libmicrohttpd's calls for more.
struct Streamer {
  std::function<bool(std::string*)> next;
  std::string pending;
  size_t offset = 0;
  bool done = false;

  static ssize_t Fill(void* cls, uint64_t /*pos*/, char* buf, size_t max) {
    auto* self = static_cast<Streamer*>(cls);
    while (self->offset >= self->pending.size()) {
      if (self->done) return MHD_CONTENT_READER_END_OF_STREAM;
      self->pending.clear();
      self->offset = 0;
      bool more = false;
      try {
        more = self->next(&self->pending);
      } catch (const std::exception& e) {
        LogError("http", std::string("stream threw: ") + e.what());
        return MHD_CONTENT_READER_END_WITH_ERROR;
      }
      if (!more) self->done = true;
    }
    const size_t n = std::min(max, self->pending.size() - self->offset);
    std::memcpy(buf, self->pending.data() + self->offset, n);
    self->offset += n;
    return static_cast<ssize_t>(n);
  }
  static void Free(void* cls) { delete static_cast<Streamer*>(cls); }
};

MHD_Result Queue(MHD_Connection* c, const HttpResponse& r) {
  MHD_Response* resp = nullptr;
  if (r.stream) {
    auto* streamer = new Streamer{r.stream, "", 0, false};
    resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, &Streamer::Fill, streamer,
                                             &Streamer::Free);
    if (resp == nullptr) delete streamer;
  } else {
    resp = MHD_create_response_from_buffer(r.body.size(), const_cast<char*>(r.body.data()),
                                           MHD_RESPMEM_MUST_COPY);
  }
  if (resp == nullptr) return MHD_NO;
  if (!r.content_type.empty())
    MHD_add_response_header(resp, "Content-Type", r.content_type.c_str());
  for (const auto& [name, value] : r.headers) {
    MHD_add_response_header(resp, name.c_str(), value.c_str());
  }
  MHD_Result ok = MHD_queue_response(c, static_cast<unsigned>(r.status), resp);
  MHD_destroy_response(resp);
  return ok;
}

void LogFromLibrary(void*, const char* fmt, va_list ap) {
  char line[512];
  std::vsnprintf(line, sizeof(line), fmt, ap);
  std::string text(line);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  LogDebug("http", text);
}

// The guard's id of a connection, kept in libmicrohttpd's socket context.
ConnectionGuard::Id GuardId(MHD_Connection* c) {
  const MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return info == nullptr ? 0 : reinterpret_cast<uintptr_t>(info->socket_context);
}

}  // namespace

struct HttpServer::Impl {
  HttpServer::Handler handler;
  HttpServer::Gate gate;
  HttpLimits limits;
  std::unique_ptr<ConnectionGuard> guard;
  MHD_Daemon* daemon = nullptr;

  // The head of a request: what the gate says of it, and its body's limit.
  static MHD_Result Head(Impl* self, MHD_Connection* c, Exchange* ex) {
    Admission a{std::nullopt, true, self->limits.max_body_bytes};
    if (self->gate) {
      try {
        a = self->gate(ex->req);
      } catch (const std::exception& e) {
        LogError("http", std::string("gate threw: ") + e.what());
        a = Admission{JsonError(500, "internal error"), false, 0};
      }
    }
    if (a.proven) self->guard->Proven(GuardId(c));
    if (a.refusal) {
      // Queued before the body: libmicrohttpd reads none of it and closes after the answer.
      ex->answered = true;
      return Queue(c, *a.refusal);
    }
    ex->limit = a.body_limit;
    const std::string length = ex->req.Header("content-length");
    if (!length.empty()) {
      auto n = ParseBoundedInt(length, 0, INT64_MAX, "Content-Length");
      if (n.ok() && static_cast<uint64_t>(*n) > ex->limit) {
        ex->answered = true;
        return Queue(c, JsonError(413, "the request body is " + length + " bytes; the limit is " +
                                           std::to_string(ex->limit)));
      }
    }
    if (ex->req.Header("content-type").rfind("multipart/form-data", 0) == 0) {
      ex->form = MHD_create_post_processor(c, 64 * 1024, &FormPiece, ex);
      if (ex->form == nullptr) {
        ex->answered = true;
        return Queue(c, JsonError(400, "a multipart/form-data body without a usable boundary"));
      }
    }
    return MHD_YES;
  }

  static MHD_Result Access(void* cls, MHD_Connection* c, const char* url, const char* method,
                           const char* /*version*/, const char* upload_data, size_t* upload_size,
                           void** con_cls) {
    auto* self = static_cast<Impl*>(cls);
    auto* ex = static_cast<Exchange*>(*con_cls);
    if (ex == nullptr) {  // the head has arrived; no body yet
      ex = new Exchange;
      *con_cls = ex;
      ex->req.method = method;
      ex->req.path = url;
      ex->req.peer = PeerOf(c);
      MHD_get_connection_values(c, MHD_HEADER_KIND, CollectHeader, &ex->req.headers);
      MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, CollectInto, &ex->req.query);
      return Head(self, c, ex);
    }
    if (*upload_size > 0) {
      if (ex->answered) {
        *upload_size = 0;
        return MHD_YES;
      }
      if (ex->received + *upload_size > ex->limit) {
        LogWarn("http", "closing " + ex->req.peer + ": a chunked body grew past " +
                            std::to_string(ex->limit) + " bytes");
        return MHD_NO;
      }
      ex->received += *upload_size;
      if (ex->form != nullptr) {
        if (!ex->form_failed && MHD_post_process(ex->form, upload_data, *upload_size) != MHD_YES) {
          ex->form_failed = true;
        }
      } else {
        ex->req.body.append(upload_data, *upload_size);
      }
      *upload_size = 0;
      return MHD_YES;
    }
    if (ex->answered) return MHD_YES;
    ex->answered = true;
    if (ex->form != nullptr) {
      // Its end: false when the body stopped before the closing boundary.
      if (MHD_destroy_post_processor(ex->form) != MHD_YES) ex->form_failed = true;
      ex->form = nullptr;
    }
    if (ex->form_failed)
      return Queue(c, JsonError(400, "the multipart/form-data body is malformed"));
    HttpResponse r;
    try {
      r = self->handler(ex->req);
    } catch (const std::exception& e) {
      LogError("http", std::string("handler threw: ") + e.what());
      r = JsonError(500, "internal error");
    }
    return Queue(c, r);
  }

  static void Completed(void* cls, MHD_Connection* c, void** con_cls, MHD_RequestTerminationCode) {
    delete static_cast<Exchange*>(*con_cls);
    *con_cls = nullptr;
    // Waiting for its next head now, if it stays open.
    static_cast<Impl*>(cls)->guard->Unproven(GuardId(c));
  }

  static void Connection(void* cls, MHD_Connection* c, void** socket_context,
                         MHD_ConnectionNotificationCode code) {
    auto* self = static_cast<Impl*>(cls);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
      const MHD_ConnectionInfo* info =
          MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
      if (info == nullptr) return;
      const int fd = info->connect_fd;
      *socket_context = reinterpret_cast<void*>(uintptr_t{self->guard->Opened(fd, PeerKey(fd))});
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
      // Before libmicrohttpd closes the socket: the guard never touches it after this.
      self->guard->Closed(reinterpret_cast<uintptr_t>(*socket_context));
    }
  }
};

std::string HttpRequest::Header(const std::string& lowercase_name) const {
  auto it = headers.find(lowercase_name);
  return it == headers.end() ? "" : it->second;
}

Result<ListenAddress> ParseListenAddress(const std::string& text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) {
    return InvalidArgument("listen address " + text + ": want HOST:PORT, e.g. 127.0.0.1:8080");
  }
  std::string host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  ASSIGN_OR_RETURN(int64_t port, ParseBoundedInt(text.substr(colon + 1), 0, 65535, "port"));
  if (host.empty() || host == "localhost") host = "127.0.0.1";
  in_addr v4{};
  in6_addr v6{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    if ((ntohl(v4.s_addr) >> 24) != 127) {
      return InvalidArgument("listen address " + text +
                             ": only a loopback address (127.0.0.0/8, ::1) is served, because "
                             "the API is plain HTTP and its keys would cross the network in clear");
    }
  } else if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (!IN6_IS_ADDR_LOOPBACK(&v6)) {
      return InvalidArgument("listen address " + text +
                             ": only a loopback address (127.0.0.0/8, ::1) is served, because "
                             "the API is plain HTTP and its keys would cross the network in clear");
    }
  } else {
    return InvalidArgument("listen address " + text +
                           ": the host must be a numeric loopback "
                           "address or localhost");
  }
  return ListenAddress{host, static_cast<uint16_t>(port)};
}

Result<std::unique_ptr<HttpServer>> HttpServer::Start(const ListenAddress& where,
                                                      const HttpLimits& limits, Handler handler,
                                                      Gate gate) {
  if (limits.reserved_connections >= limits.max_connections) {
    return InvalidArgument(
        "the HTTP server's reserved connections (" + std::to_string(limits.reserved_connections) +
        ") must be fewer than its cap (" + std::to_string(limits.max_connections) + ")");
  }
  const bool v6 = where.host.find(':') != std::string::npos;
  UniqueFd fd(::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoError("socket");
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_storage ss{};
  socklen_t len = 0;
  if (v6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(where.port);
    ::inet_pton(AF_INET6, where.host.c_str(), &a->sin6_addr);
    len = sizeof(*a);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_port = htons(where.port);
    ::inet_pton(AF_INET, where.host.c_str(), &a->sin_addr);
    len = sizeof(*a);
  }
  const std::string shown =
      (v6 ? "[" + where.host + "]" : where.host) + ":" + std::to_string(where.port);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    return Status(Code::kUnavailable, "listen on " + shown + ": " + std::strerror(errno));
  }
  if (::listen(fd.get(), 128) != 0) return ErrnoError("listen on " + shown);
  sockaddr_storage bound{};
  socklen_t blen = sizeof(bound);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &blen) != 0) {
    return ErrnoError("getsockname");
  }
  const uint16_t port = ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                 : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);

  std::unique_ptr<HttpServer> server(new HttpServer());
  server->impl_ = std::make_unique<Impl>();
  server->impl_->handler = std::move(handler);
  server->impl_->gate = std::move(gate);
  server->impl_->limits = limits;
  // The guard keeps the cap; libmicrohttpd's, twice as high, leaves room for connections
  // the guard cut that the library has not closed yet.
  ConnectionGuard::Limits guard;
  guard.max_total = limits.max_connections;
  guard.max_unproven = limits.max_connections - limits.reserved_connections;
  guard.max_unproven_per_peer = limits.max_unproven_per_peer;
  guard.head_timeout = std::chrono::seconds(limits.head_timeout_s);
  server->impl_->guard = std::make_unique<ConnectionGuard>(
      guard, [](int conn_fd) { (void)::shutdown(conn_fd, SHUT_RDWR); });
  server->host_ = where.host;
  server->port_ = port;
  server->limits_ = limits;
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_AUTO |
                   MHD_USE_ERROR_LOG;
  if (v6) flags |= MHD_USE_IPv6;
  const int listen_fd = fd.get();
  server->impl_->daemon = MHD_start_daemon(
      flags, 0, nullptr, nullptr, &Impl::Access, server->impl_.get(), MHD_OPTION_LISTEN_SOCKET,
      listen_fd, MHD_OPTION_CONNECTION_LIMIT, 2 * limits.max_connections,
      MHD_OPTION_CONNECTION_TIMEOUT, limits.idle_timeout_s, MHD_OPTION_NOTIFY_COMPLETED,
      &Impl::Completed, server->impl_.get(), MHD_OPTION_NOTIFY_CONNECTION, &Impl::Connection,
      server->impl_.get(), MHD_OPTION_EXTERNAL_LOGGER, &LogFromLibrary, nullptr, MHD_OPTION_END);
  if (server->impl_->daemon == nullptr) return Internal("libmicrohttpd did not start on " + shown);
  (void)fd.Release();  // the daemon closes it when it stops
  return server;
}

HttpServer::~HttpServer() {
  if (impl_ && impl_->daemon != nullptr) MHD_stop_daemon(impl_->daemon);
}

std::string HttpServer::url() const {
  const bool v6 = host_.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
}

HttpResponse JsonError(int status, const std::string& message) {
  nlohmann::json j = {{"code", status}, {"message", message}};
  return {status,
          "application/json",
          {},
          j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

HttpResponse JsonReply(int status, const std::string& json_text) {
  return {status, "application/json", {}, json_text};
}

}  // namespace trybox::api
