// Images built from recipes, end to end: real VMs, the host's apt sources, the npm registry
// through the egress proxy (docs/images.md, "Recipes").
//
// The registry's name comes from the host's npm configuration and its address from the
// resolver, at run time; it is granted with the operator's internal_allow because on this
// machine it resolves to a documentation-range address the egress refuses by default.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netdb.h>

#include "tests/e2e/harness.h"
#include "tests/e2e/upstream.h"
#include "util/fd.h"

namespace trybox::e2e {
namespace {

using Json = nlohmann::json;

// "registry.example.org" from `npm config get registry` ("https://registry.example.org/").
std::string NpmRegistryHost() {
  CliResult r = RunProgram({"/bin/sh", "-c", "npm config get registry"},
                           {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root"});
  std::string url = r.out.substr(0, r.out.find('\n'));
  const std::string scheme = "https://";
  if (r.code != 0 || url.rfind(scheme, 0) != 0) return "";
  std::string host = url.substr(scheme.size());
  return host.substr(0, host.find_first_of("/:"));
}

// The CA file the host's npm verifies the registry with (`npm config get cafile`), else
// the system bundle.
std::string NpmCaFile() {
  CliResult r = RunProgram({"/bin/sh", "-c", "npm config get cafile"},
                           {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root"});
  std::string f = r.out.substr(0, r.out.find('\n'));
  if (r.code != 0 || f.empty() || f == "null" || f == "undefined") {
    return "/etc/ssl/certs/ca-certificates.crt";
  }
  return f;
}

std::string FirstIpv4(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "443", &hints, &res) != 0 || !res) return "";
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof buf);
  ::freeaddrinfo(res);
  return buf;
}

class RecipeE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = NpmRegistryHost();
    ASSERT_FALSE(registry_.empty()) << "npm config get registry gave no https URL";
    std::string addr = FirstIpv4(registry_);
    ASSERT_FALSE(addr.empty()) << "cannot resolve the npm registry";
    auto h = Harness::Start({"TRYBOX_PROGRESS=always"});
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    ASSERT_TRUE((*h)->StopDaemon().ok());
    ASSERT_TRUE(MakeDirs((*h)->home() + "/config", 0700).ok());
    // An HTTP origin on loopback for the transparent-path test; with a resolver map the
    // registry's name must be in it too (the map never falls back to DNS).
    up_ = new HttpUpstream();
    const std::string up_port = std::to_string(up_->port());
    Json config = {
        {"internal_allow", {addr + ":443", "127.0.0.1:" + up_port}},
        {"resolve",
         {{registry_, {addr}}, {"upstream.test", {"127.0.0.1"}}, {"evil.test", {"127.0.0.1"}}}}};
    ASSERT_TRUE(WriteFileAtomic((*h)->home() + "/config/egress.json", config.dump()).ok());
    ASSERT_TRUE((*h)->RestartDaemon().ok());
    h_ = std::move(*h).release();
    name_ = "recipe-e2e-" + std::to_string(::getpid());
  }
  static void TearDownTestSuite() {
    if (h_) (void)h_->Call({{"verb", "image_rm"}, {"name", name_}});
    delete h_;
    h_ = nullptr;
    delete up_;
    up_ = nullptr;
  }

  // debian-12 with nodejs, a small package from the npm registry fetched in the guest
  // through the egress proxy, a copy, env and checks.
  static Json NodeRecipe() {
    const std::string tgz = "https://" + registry_ + "/is-number/-/is-number-7.0.0.tgz";
    return {{"from", "debian-12"},
            {"packages", {"nodejs"}},
            {"allow", {registry_ + ":443"}},
            {"env", {{"RECIPE_E2E", "baked"}}},
            {"steps",
             {{{"copy", "files"}, {"to", "/opt/recipe/files"}},
              // The CA bundle the host's npm trusts (a local mirror may have its own CA).
              {{"copy", "host-ca.crt"}, {"to", "/opt/recipe/host-ca.crt"}},
              {{"run",
                "mkdir -p npm && curl -fsS --cacert /opt/recipe/host-ca.crt \"$TGZ\" | "
                "tar -xz -C npm && test -f npm/package/package.json"},
               {"workdir", "/opt"},
               {"env", {{"TGZ", tgz}}}}}},
            {"check",
             {"node --version", "test -f /opt/npm/package/package.json",
              "grep -q 'hello from the recipe' /opt/recipe/files/hello.txt",
              "test \"$RECIPE_E2E\" = baked"}}};
  }
  // Builds the image of NodeRecipe (a no-op when the first test already did).
  static void BuildNodeImage() {
    const std::string file = WriteRecipe("ok", NodeRecipe());
    auto ca = ReadFileToString(NpmCaFile());
    ASSERT_TRUE(ca.ok()) << NpmCaFile();
    ASSERT_TRUE(WriteFileAtomic(h_->home() + "/ok/host-ca.crt", *ca).ok());
    CliResult b = h_->Cli({"image", "build", name_, "-f", file});
    ASSERT_EQ(b.code, 0) << b.err;
  }
  // A recipe folder under the harness home with `recipe` as recipe.json and one file.
  static std::string WriteRecipe(const std::string& dir_name, const Json& recipe) {
    const std::string dir = h_->home() + "/" + dir_name;
    EXPECT_TRUE(MakeDirs(dir + "/files").ok());
    EXPECT_TRUE(WriteFileAtomic(dir + "/files/hello.txt", "hello from the recipe\n").ok());
    EXPECT_TRUE(WriteFileAtomic(dir + "/recipe.json", recipe.dump(2)).ok());
    return dir + "/recipe.json";
  }

  static bool Listed(const std::string& name) {
    CliResult ls = h_->Cli({"image", "ls", "--json"});
    return ls.out.find("\"" + name + "\"") != std::string::npos;
  }

  static bool NoVms() {
    CliResult ls = h_->Cli({"ls", "--json"});
    Json j = Json::parse(ls.out, nullptr, false);
    return j.is_array() ? j.empty() : ls.out.find("\"id\"") == std::string::npos;
  }

  static inline Harness* h_ = nullptr;
  static inline HttpUpstream* up_ = nullptr;
  static inline std::string registry_;
  static inline std::string name_;
};

TEST_F(RecipeE2E, BuildsAPackageAnNpmDownloadACopyAndEnvThenRebuildIsANoOp) {
  const Json recipe = NodeRecipe();
  const std::string file = WriteRecipe("ok", recipe);
  auto ca = ReadFileToString(NpmCaFile());
  ASSERT_TRUE(ca.ok()) << NpmCaFile();
  ASSERT_TRUE(WriteFileAtomic(h_->home() + "/ok/host-ca.crt", *ca).ok());
  CliResult b = h_->Cli({"image", "build", name_, "-f", file});
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_NE(b.err.find("] run: mkdir -p npm"), std::string::npos) << b.err;  // progress line
  EXPECT_NE(b.err.find("] packages: nodejs"), std::string::npos) << b.err;
  EXPECT_TRUE(Listed(name_));

  // The manifest records the recipe, its hash, the base and the packages.
  auto images_dir = h_->Call({{"verb", "doctor"}});
  ASSERT_TRUE(images_dir.ok());
  auto text = ReadFileToString((*images_dir)["paths"]["images"].get<std::string>() + "/" + name_ +
                               "/manifest.json");
  ASSERT_TRUE(text.ok());
  Json m = Json::parse(*text, nullptr, false);
  EXPECT_EQ(m["recipe"]["packages"], Json({"nodejs"}));
  EXPECT_EQ(m["recipe_sha256"].get<std::string>().size(), 64u);
  EXPECT_EQ(m["parent"]["name"], "debian-12");

  // A fresh VM of the image has the package (node runs the module from the registry), the
  // copy and the env; the second run restores the template the first one built. nodejs
  // brings a few thousand files: a layer that size once failed to freeze (its measure saw
  // one entry), so this is also that regression's test.
  CliResult run1 = h_->Cli({"run", "--image", name_, "--", "sh", "-c",
                            "node -e \"process.exit(require('/opt/npm/package')(7) ? 0 : 1)\" && "
                            "cat /opt/recipe/files/hello.txt && echo \"$RECIPE_E2E\""});
  ASSERT_EQ(run1.code, 0) << run1.err;
  EXPECT_NE(run1.out.find("hello from the recipe"), std::string::npos);
  EXPECT_NE(run1.out.find("baked"), std::string::npos);
  CliResult run2 = h_->Cli({"run", "--image", name_, "--", "node", "--version"});
  ASSERT_EQ(run2.code, 0) << run2.err;
  CliResult images = h_->Cli({"image", "ls", "--json"});
  Json list = Json::parse(images.out, nullptr, false);
  ASSERT_TRUE(list.is_array()) << images.out;
  bool ready = false;
  for (const auto& im : list) {
    if (im.value("name", "") == name_) ready = im["template"].value("state", "") == "valid";
  }
  EXPECT_TRUE(ready) << images.out;

  // Unchanged recipe and base: nothing is rebuilt and no VM starts.
  CliResult again = h_->Cli({"image", "build", name_, "-f", file});
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.out.find("up to date"), std::string::npos) << again.out;
  EXPECT_EQ(again.err.find("create:"), std::string::npos) << again.err;
}

TEST_F(RecipeE2E, AFailingStepLeavesNothingListedAndNamesItsExitCodeAndOutput) {
  const std::string name = name_ + "-fail";
  Json recipe = {{"from", "debian-12"},
                 {"steps",
                  {{{"run", "echo about to fail"}},
                   {{"run", "echo the-last-words >&2; exit 7"}},
                   {{"run", "echo never"}}}}};
  CliResult b = h_->Cli({"image", "build", name, "-f", WriteRecipe("fail", recipe)});
  EXPECT_NE(b.code, 0);
  EXPECT_NE(b.err.find("step 2"), std::string::npos) << b.err;
  EXPECT_NE(b.err.find("exit code 7"), std::string::npos) << b.err;
  EXPECT_NE(b.err.find("the-last-words"), std::string::npos) << b.err;
  EXPECT_EQ(b.err.find("[4/"), std::string::npos) << b.err;  // step 3 never ran
  EXPECT_FALSE(Listed(name));
  EXPECT_TRUE(NoVms());
}

TEST_F(RecipeE2E, AFailingCheckRemovesTheImage) {
  const std::string name = name_ + "-check";
  Json recipe = {{"from", "debian-12"},
                 {"steps", {{{"run", "touch /opt/made"}}}},
                 {"check", {"test -f /opt/made", "test -f /opt/never-made"}}};
  CliResult b = h_->Cli({"image", "build", name, "-f", WriteRecipe("check", recipe)});
  EXPECT_NE(b.code, 0);
  EXPECT_NE(b.err.find("check 2 (test -f /opt/never-made) failed"), std::string::npos) << b.err;
  EXPECT_FALSE(Listed(name));
  EXPECT_TRUE(NoVms());
}

// A rebuild whose checks fail keeps the image it would have replaced: the new build is
// checked under a staged name first, and that name goes with the failure.
TEST_F(RecipeE2E, ARebuildWhoseCheckFailsKeepsTheOldImage) {
  const std::string name = name_ + "-keep";
  Json good = {{"from", "debian-12"},
               {"steps", {{{"run", "echo one > /opt/version"}}}},
               {"check", {"test -f /opt/version"}}};
  CliResult b1 = h_->Cli({"image", "build", name, "-f", WriteRecipe("keep1", good)});
  ASSERT_EQ(b1.code, 0) << b1.err;
  Json bad = {{"from", "debian-12"},
              {"steps", {{{"run", "echo two > /opt/version"}}}},
              {"check", {"grep -q one /opt/version"}}};
  CliResult b2 = h_->Cli({"image", "build", name, "-f", WriteRecipe("keep2", bad)});
  EXPECT_NE(b2.code, 0);
  EXPECT_NE(b2.err.find("check 1 (grep -q one /opt/version) failed"), std::string::npos) << b2.err;
  EXPECT_TRUE(Listed(name)) << b2.err;
  CliResult ls = h_->Cli({"image", "ls", "--json"});
  ASSERT_EQ(ls.code, 0) << ls.err;
  EXPECT_EQ(ls.out.find("-next-"), std::string::npos) << ls.out;
  CliResult run = h_->Cli({"run", "--image", name, "--", "cat", "/opt/version"});
  EXPECT_EQ(run.code, 0) << run.err;
  EXPECT_EQ(run.out, "one\n");
  EXPECT_TRUE(NoVms());
  // A rebuild that passes replaces it.
  Json next = {{"from", "debian-12"},
               {"steps", {{{"run", "echo three > /opt/version"}}}},
               {"check", {"grep -q three /opt/version"}}};
  CliResult b3 = h_->Cli({"image", "build", name, "-f", WriteRecipe("keep3", next)});
  ASSERT_EQ(b3.code, 0) << b3.err;
  run = h_->Cli({"run", "--image", name, "--", "cat", "/opt/version"});
  EXPECT_EQ(run.out, "three\n") << run.err;
  ls = h_->Cli({"image", "ls", "--json"});
  EXPECT_EQ(ls.out.find("-next-"), std::string::npos) << ls.out;
  EXPECT_EQ(h_->Cli({"image", "rm", name}).code, 0);
  EXPECT_TRUE(NoVms());
}

TEST_F(RecipeE2E, BadInputIsRefusedBeforeAnyVmStarts) {
  Json escape = {{"from", "debian-12"}, {"steps", {{{"copy", "../.."}, {"to", "/opt/x"}}}}};
  CliResult e = h_->Cli({"image", "build", name_ + "-esc", "-f", WriteRecipe("esc", escape)});
  EXPECT_NE(e.code, 0);
  EXPECT_NE(e.err.find("escapes the recipe's folder"), std::string::npos) << e.err;

  Json unknown_base = {{"from", "no-such-base"}};
  CliResult u = h_->Cli({"image", "build", name_ + "-ub", "-f", WriteRecipe("ub", unknown_base)});
  EXPECT_NE(u.code, 0);
  EXPECT_NE(u.err.find("unknown base"), std::string::npos) << u.err;

  Json typo = {{"from", "debian-12"}, {"steps", {{{"run", "true"}, {"wrkdir", "/"}}}}};
  CliResult t = h_->Cli({"image", "build", name_ + "-typo", "-f", WriteRecipe("typo", typo)});
  EXPECT_NE(t.code, 0);
  EXPECT_NE(t.err.find("$.steps[0].wrkdir: unknown key"), std::string::npos) << t.err;

  CliResult n = h_->Cli({"image", "build", "bad/name", "-f", WriteRecipe("n", unknown_base)});
  EXPECT_NE(n.code, 0);
  EXPECT_NE(n.err.find("image name"), std::string::npos) << n.err;
  EXPECT_TRUE(NoVms());
}

// Node's built-in fetch ignores HTTP_PROXY: it resolves through the guest's resolver and its
// connection is steered to the host, decided and audited by name (docs/protocol/egress.md,
// "Transparent egress"). A name off the list does not resolve.
TEST_F(RecipeE2E, NodesBuiltInFetchIgnoresTheProxyAndIsDecidedByName) {
  BuildNodeImage();
  const std::string port = std::to_string(up_->port());
  CliResult c = h_->Cli({"create", "--image", name_, "--allow", "upstream.test:" + port});
  ASSERT_EQ(c.code, 0) << c.err;
  const std::string id = c.out.substr(0, c.out.find('\n'));
  const int before = up_->accepts();
  auto fetch = [&](const std::string& host) {
    return h_->Cli({"exec", id, "--", "node", "-e",
                    "fetch('http://" + host + ":" + port +
                        "/').then(r => r.text()).then(t => console.log(t), "
                        "e => console.log('error', e.cause && e.cause.code))"});
  };
  CliResult r = fetch("upstream.test");
  EXPECT_EQ(r.out, "hello\n") << r.err;
  EXPECT_EQ(up_->accepts(), before + 1);
  r = fetch("evil.test");
  EXPECT_EQ(r.out, "error ENOTFOUND\n") << r.err;
  EXPECT_EQ(up_->accepts(), before + 1);
  CliResult audit = h_->Cli({"audit", "--vm", id, "--json"});
  ASSERT_EQ(audit.code, 0) << audit.err;
  bool allowed = false, refused = false;
  for (const auto& e : Json::parse(audit.out)) {
    allowed = allowed ||
              (e["method"] == "TCP" && e["host"] == "upstream.test" && e["verdict"] == "allowed");
    refused = refused || (e["method"] == "DNS" && e["host"] == "evil.test");
  }
  EXPECT_TRUE(allowed) << audit.out;
  EXPECT_TRUE(refused) << audit.out;
  EXPECT_EQ(h_->Cli({"rm", id}).code, 0);
}

}  // namespace
}  // namespace trybox::e2e
