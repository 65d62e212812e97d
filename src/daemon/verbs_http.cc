// The HTTP API's verbs (docs/protocol/daemon.md): serve, and the keys' api_key_create,
// api_key_ls and api_key_rm. Only the socket's owner reaches these, so only the daemon's
// user can start the server or mint a key.
#include "daemon/verbs.h"

namespace trybox::daemon {

void AddHttpVerbs(VerbTable& t, Services& s) {
  t.AddUnary("serve", [&s](const Json& j, Connection&) -> Json {
    auto req = ParseServe(j);
    if (!req.ok()) return ErrorReply(req.status());
    if (req->stop) {
      RememberListen(s.paths.state, "");  // a stop is not undone by a restart
      return {{"ok", true}, {"stopped", s.http.StopServing()}};
    }
    auto where = api::ParseListenAddress(req->listen);
    if (!where.ok()) return ErrorReply(where.status());
    auto url = ServeRemembering(s.http, s.paths.state, *where);
    if (!url.ok()) return ErrorReply(url.status());
    return {{"ok", true}, {"url", *url}};
  });
  t.AddUnary("api_key_create", [&s](const Json& j, Connection&) -> Json {
    auto req = ParseApiKey(j);
    if (!req.ok()) return ErrorReply(req.status());
    auto k = s.http.keys().Create(req->name, req->scope);
    if (!k.ok()) return ErrorReply(k.status());
    // The only time the key is ever sent anywhere.
    return {{"ok", true},
            {"id", k->record.id},
            {"name", k->record.name},
            {"scope", k->record.scope},
            {"key", k->key}};
  });
  t.AddUnary("api_key_ls", [&s](const Json&, Connection&) -> Json {
    auto keys = s.http.keys().List();
    if (!keys.ok()) return ErrorReply(keys.status());
    Json out = Json::array();
    for (const auto& k : *keys) {
      out.push_back(
          {{"id", k.id}, {"name", k.name}, {"scope", k.scope}, {"created_at", k.created_at}});
    }
    const auto url = s.http.url();
    return {{"ok", true}, {"keys", out}, {"serving", url ? Json(*url) : Json(nullptr)}};
  });
  t.AddUnary("api_key_rm", [&s](const Json& j, Connection&) -> Json {
    auto req = ParseApiKey(j);
    if (!req.ok()) return ErrorReply(req.status());
    Status st = s.http.keys().Remove(req->name);
    if (!st.ok()) return ErrorReply(st);
    return {{"ok", true}};
  });
}

}  // namespace trybox::daemon
