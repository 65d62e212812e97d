#include "daemon/control_server.h"

#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <thread>

#include "util/log.h"
#include "util/names.h"

namespace trybox::daemon {

bool Connection::AddEphemeral(const std::string& vm) {
  MutexLock lock(mu_);
  if (closed_) return false;
  ephemeral_.push_back(vm);
  return true;
}

std::vector<std::string> Connection::Close() {
  MutexLock lock(mu_);
  closed_ = true;
  std::vector<std::string> out;
  out.swap(ephemeral_);
  return out;
}

void VerbTable::AddUnary(const std::string& verb, Unary handler) {
  verbs_[verb] = Verb{std::move(handler), nullptr};
  order_.push_back(verb);
}

void VerbTable::AddStreaming(const std::string& verb, Streaming handler) {
  verbs_[verb] = Verb{nullptr, std::move(handler)};
  order_.push_back(verb);
}

std::vector<std::string> VerbTable::Names() const { return order_; }

void VerbTable::Dispatch(channel::Stream& stream, Json& request, Connection& conn) const {
  Fields f(request);
  Status st = f.CheckObject();
  auto verb = st.ok() ? f.String("verb") : Result<std::string>(st);
  if (!verb.ok()) {
    (void)stream.End(ErrorReply(verb.status()));
    return;
  }
  auto it = verbs_.find(*verb);
  if (it == verbs_.end()) {
    std::string names;
    for (const auto& n : order_) names += (names.empty() ? "" : ", ") + n;
    (void)stream.End(ErrorReply(
        InvalidArgument("unknown verb " + QuoteForMessage(*verb) + " (verbs: " + names + ")")));
    return;
  }
  try {
    if (it->second.unary) {
      (void)stream.End(it->second.unary(request, conn));
    } else {
      it->second.streaming(stream, request, conn);
    }
  } catch (const std::exception& e) {
    // A bug, not a bad request: the parsers refuse those before any work. The request fails
    // alone and the daemon keeps serving.
    LogError("daemon", "verb " + *verb + " failed: " + e.what());
    if (!stream.finished()) {
      (void)stream.End(ErrorReply(Internal(std::string("the daemon failed: ") + e.what())));
    }
  }
  if (!stream.finished()) (void)stream.Reset("the verb ended without a result");
}

Status ControlServer::Listen(const std::string& socket_path) {
  ASSIGN_OR_RETURN(UnixListener l, UnixListener::Listen(socket_path));
  listener_.emplace(std::move(l));
  return Status::Ok();
}

Status ControlServer::Serve() {
  for (;;) {
    auto c = listener_->Accept();
    if (!c.ok()) {
      if (stopping_) return Status::Ok();
      return c.status();
    }
    auto cred = GetPeerCred(c->get());
    if (!cred.ok() || (cred->uid != ::geteuid() && cred->uid != 0)) {
      LogWarn("daemon", "refused a connection from uid " +
                            (cred.ok() ? std::to_string(cred->uid) : std::string("unknown")));
      continue;  // dropping the fd closes the connection
    }
    std::thread([this, fd = std::move(*c), uid = cred->uid]() mutable {
      HandleClient(std::move(fd), uid);
    }).detach();
  }
}

Result<UniqueFd> ControlServer::Attach() {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    return ErrnoError("socketpair for an in-daemon connection");
  }
  UniqueFd ours(pair[0]);
  UniqueFd theirs(pair[1]);
  std::thread([this, fd = std::move(theirs)]() mutable {
    HandleClient(std::move(fd), ::geteuid());
  }).detach();
  return ours;
}

void ControlServer::Stop() {
  stopping_ = true;
  if (listener_) listener_->Shutdown();
}

void ControlServer::HandleClient(UniqueFd fd, uid_t uid) {
  // The client opens streams (odd ids), like the host does towards a guest.
  auto mux = std::make_shared<channel::Mux>(std::move(fd), channel::Role::kGuest);
  auto conn = std::make_shared<Connection>(uid);
  std::promise<void> dead;
  auto fut = dead.get_future();
  mux->OnOpen([this, conn](std::shared_ptr<channel::Stream> s, Json req) {
    verbs_.Dispatch(*s, req, *conn);
  });
  mux->OnDeath([&dead](const std::string& why) {
    // A client that simply hung up is routine; anything else (a bad frame, a failed write)
    // is worth a line when a caller reports a dropped connection.
    if (why != "connection closed") LogWarn("daemon", "client connection lost: " + why);
    dead.set_value();
  });
  mux->Start();
  fut.wait();
  // Usually already destroyed by the client itself; then this is a no-op.
  for (const auto& id : conn->Close()) on_close_(id);
}

}  // namespace trybox::daemon
