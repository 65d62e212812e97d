#include "cli/http_cmd.h"

#include <ctime>
#include <ostream>

#include "cli/cli.h"
#include "cli/reply.h"
#include "util/names.h"
#include "util/utf8.h"

namespace trybox::cli {

void AddHttpCommands(CLI::App& app, Invocation& inv) {
  auto* serve = app.add_subcommand(
      "serve", "Serve the HTTP API (E2B-compatible) from tryboxd on a loopback address");
  serve->add_option("--listen", inv.http.listen,
                    "HOST:PORT, a loopback address (default 127.0.0.1:0, a free port)");
  serve->add_flag("--stop", inv.http.stop, "Stop serving (sandboxes stay until their timeout)");
  serve->add_flag("--json", inv.json, "JSON output");
  serve->callback([&inv] { inv.command = "serve"; });

  auto* key = app.add_subcommand("api-key", "Make, list and remove the HTTP API's keys");
  key->require_subcommand(1);
  auto* create = key->add_subcommand("create", "Make a key; it is printed once, never again");
  create->add_option("name", inv.http.key_name, "A name for the key")->required();
  create->add_flag("--operator", inv.http.key_operator,
                   "Also trybox's own REST routes (/trybox/v1: every VM's audit, workspaces, "
                   "agent runs), with the authority of this CLI; without it, a key reaches only "
                   "the sandboxes it creates through E2B's API");
  create->add_flag("--json", inv.json, "JSON output");
  create->callback([&inv] { inv.command = "api-key-create"; });
  auto* ls = key->add_subcommand("ls", "List the keys (names and ids, never the keys)");
  ls->add_flag("--json", inv.json, "JSON output");
  ls->callback([&inv] { inv.command = "api-key-ls"; });
  auto* rm = key->add_subcommand("rm", "Remove a key: requests with it are refused at once");
  rm->add_option("name", inv.http.key_name, "The key's name")->required();
  rm->callback([&inv] { inv.command = "api-key-rm"; });
}

bool IsHttpCommand(const std::string& command) {
  return command == "serve" || command.rfind("api-key-", 0) == 0;
}

namespace {

int Fail(std::ostream& err, const Status& st) {
  err << "trybox: " << OneLine(st.message()) << "\n";
  return 125;
}

std::string Date(double epoch_s) {
  const std::time_t t = static_cast<std::time_t>(epoch_s);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

}  // namespace

int RunHttpCommand(Client& c, const Invocation& inv, std::ostream& out, std::ostream& err) {
  if (inv.command == "serve") {
    auto r = c.Call({{"verb", "serve"}, {"listen", inv.http.listen}, {"stop", inv.http.stop}});
    if (!r.ok()) return Fail(err, r.status());
    ReplyView reply(*r);
    if (inv.json) {
      out << r->dump(2) << "\n";
      return 0;
    }
    if (inv.http.stop) {
      auto stopped = reply.Bool("stopped");
      if (!stopped.ok()) return Fail(err, stopped.status());
      out << (*stopped ? "stopped serving\n" : "was not serving\n");
      return 0;
    }
    auto url = reply.String("url");
    if (!url.ok()) return Fail(err, url.status());
    out << "serving on " << *url << "\n"
        << "for E2B's SDKs:\n"
        << "  export E2B_API_URL=" << *url << "\n"
        << "  export E2B_SANDBOX_URL=" << *url << "\n"
        << "  export E2B_API_KEY=<a key from `trybox api-key create NAME`>\n";
    return 0;
  }
  if (inv.command == "api-key-create") {
    auto r = c.Call({{"verb", "api_key_create"},
                     {"name", inv.http.key_name},
                     {"scope", inv.http.key_operator ? "operator" : "sandboxes"}});
    if (!r.ok()) return Fail(err, r.status());
    ReplyView reply(*r);
    auto key = reply.String("key");
    auto id = reply.String("id");
    if (!key.ok()) return Fail(err, key.status());
    if (!id.ok()) return Fail(err, id.status());
    if (inv.json) {
      out << r->dump(2) << "\n";
      return 0;
    }
    out << *key << "\n";
    err << "API key " << inv.http.key_name << " (" << *id << ", "
        << (inv.http.key_operator ? "operator: every VM and run" : "its own sandboxes")
        << ") made. It is shown this once; tryboxd keeps only its hash.\n";
    return 0;
  }
  if (inv.command == "api-key-ls") {
    auto r = c.Call({{"verb", "api_key_ls"}});
    if (!r.ok()) return Fail(err, r.status());
    if (inv.json) {
      out << r->dump(2) << "\n";
      return 0;
    }
    ReplyView reply(*r);
    auto keys = reply.Array("keys");
    if (!keys.ok()) return Fail(err, keys.status());
    out << "NAME                 ID            SCOPE      CREATED\n";
    for (const nlohmann::json& item : **keys) {
      ReplyView k(item);
      auto name = k.String("name");
      auto id = k.String("id");
      auto created = k.Number("created_at");
      std::string scope = k.String("scope").value_or("sandboxes");
      scope.resize(std::max<size_t>(scope.size() + 1, 11), ' ');
      if (!name.ok()) return Fail(err, name.status());
      if (!id.ok()) return Fail(err, id.status());
      if (!created.ok()) return Fail(err, created.status());
      std::string line = *name;
      line.resize(std::max<size_t>(line.size() + 1, 21), ' ');
      std::string idcol = *id;
      idcol.resize(std::max<size_t>(idcol.size() + 1, 14), ' ');
      out << line << idcol << scope << Date(*created) << "\n";
    }
    return 0;
  }
  if (inv.command == "api-key-rm") {
    auto r = c.Call({{"verb", "api_key_rm"}, {"name", inv.http.key_name}});
    if (!r.ok()) return Fail(err, r.status());
    return 0;
  }
  err << "trybox: unknown command " << inv.command << "\n";
  return 125;
}

}  // namespace trybox::cli
