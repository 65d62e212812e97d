#include "egress/secrets.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <set>
#include <string>

#include "egress/secrets_test_util.h"

namespace trybox::egress {
namespace {

SecretInput Input(std::string name, std::string value, std::vector<std::string> hosts) {
  SecretInput in;
  in.name = std::move(name);
  in.value = std::move(value);
  in.hosts = std::move(hosts);
  return in;
}

TEST(SecretsTest, APlaceholderKeepsTheValuesLengthAndCharacterClassButNotItsContent) {
  auto hex = MakePlaceholder("0123456789abcdef0123456789abcdef");
  ASSERT_TRUE(hex.ok());
  EXPECT_EQ(hex->size(), 32u);
  EXPECT_EQ(hex->find_first_not_of("0123456789abcdef"), std::string::npos);
  auto upper = MakePlaceholder("0123456789ABCDEF0123");
  ASSERT_TRUE(upper.ok());
  EXPECT_EQ(upper->find_first_not_of("0123456789ABCDEF"), std::string::npos);
  auto token = MakePlaceholder("ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789");
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(token->size(), 40u);
  EXPECT_EQ(
      token->find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"),
      std::string::npos);
  // Short values still get a placeholder that cannot turn up by chance.
  auto shortv = MakePlaceholder("pw");
  ASSERT_TRUE(shortv.ok());
  EXPECT_EQ(shortv->size(), kMinPlaceholder);
  // Drawn afresh each time.
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) seen.insert(MakePlaceholder("same-value-every-time").value());
  EXPECT_EQ(seen.size(), 100u);
}

TEST(SecretsTest, ASetGivesTheGuestPlaceholdersAndBindsEachSecretToItsHostsOnly) {
  auto set = SecretSet::Make({Input("GH_TOKEN", "real-gh-value-123456", {"api.github.test"}),
                              Input("NPM_TOKEN", "real-npm-value-7890ab", {"*.npm.test"})});
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  const auto& s = (*set)->secrets();
  ASSERT_EQ(s.size(), 2u);
  auto env = (*set)->GuestEnv();
  EXPECT_EQ(env.at("GH_TOKEN"), s[0].placeholder);
  EXPECT_NE(env.at("GH_TOKEN"), "real-gh-value-123456");
  EXPECT_EQ(s[0].value.view(), "real-gh-value-123456");
  EXPECT_TRUE((*set)->BindsHost("api.github.test"));
  EXPECT_TRUE((*set)->BindsHost("registry.npm.test"));
  EXPECT_FALSE((*set)->BindsHost("npm.test"));  // a wildcard is subdomains only
  EXPECT_FALSE((*set)->BindsHost("github.test"));
  std::string header = "Authorization: Bearer " + s[0].placeholder;
  EXPECT_EQ((*set)->ForeignPlaceholder(header, "api.github.test"), nullptr);
  const Secret* foreign = (*set)->ForeignPlaceholder(header, "registry.npm.test");
  ASSERT_NE(foreign, nullptr);
  EXPECT_EQ(foreign->name, "GH_TOKEN");
}

TEST(SecretsTest, BadDeclarationsAreRefusedNamingTheSecretNeverItsValue) {
  const std::string value = "do-not-print-this-value";
  auto expect_refused = [&](SecretInput in, const std::string& words) {
    std::vector<SecretInput> v;
    v.push_back(std::move(in));
    auto r = SecretSet::Make(std::move(v));
    ASSERT_FALSE(r.ok()) << words;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().find(value), std::string::npos) << r.status().message();
  };
  expect_refused(Input("1BAD", value, {"a.test"}), "is not a variable name");
  expect_refused(Input("A-B", value, {"a.test"}), "is not a variable name");
  expect_refused(Input("TOKEN", "", {"a.test"}), "empty value");
  expect_refused(Input("TOKEN", value, {}), "bound to no host");
  expect_refused(Input("TOKEN", value + "\r\nX: y", {"a.test"}), "CR or LF");
  expect_refused(Input("TOKEN", std::string(kMaxSecretValue + 1, 'a'), {"a.test"}), "longer");
  expect_refused(Input("TOKEN", value, {"a.test:443"}), "has a port");
  expect_refused(Input("TOKEN", value, {"127.0.0.1"}), "TOKEN");
  auto twice = SecretSet::Make({Input("T", value, {"a.test"}), Input("T", value, {"b.test"})});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("declared twice"), std::string::npos);
}

// The value's pages are out of core dumps: /proc/self/smaps shows the "dd" flag on them.
TEST(SecretsTest, AValueLivesInPagesExcludedFromCoreDumps) {
  auto v = SecretValue::Copy("a value that must stay out of core dumps");
  ASSERT_TRUE(v.ok());
  auto addr = reinterpret_cast<uintptr_t>(v->view().data());
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in_mapping = false, found = false;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {
      in_mapping = addr >= lo && addr < hi;
      continue;
    }
    if (in_mapping && line.rfind("VmFlags:", 0) == 0) {
      found = true;
      EXPECT_NE(line.find(" dd"), std::string::npos) << line;
    }
  }
  EXPECT_TRUE(found);
  // Moving keeps one owner; the moved-from value is empty.
  SecretValue moved = std::move(*v);
  EXPECT_EQ(moved.view(), "a value that must stay out of core dumps");
  EXPECT_TRUE(v->view().empty());
}

// Issue 13: a vm_agent run kept its --secret values as std::strings for its whole life.
// Held secrets live in pages out of core dumps, and holding them wipes the inputs.
TEST(SecretsTest, HoldingSecretsMovesTheirValuesIntoPagesOutOfCoreDumpsAndWipesTheInputs) {
  const std::string long_value = "ghp_held-secret-value-0123456789abcdef";
  std::vector<SecretInput> inputs = {Input("GH", long_value, {"api.github.com"}),
                                     Input("PW", "short", {"*.b.test"})};
  inputs[1].body = true;
  inputs[1].keep_cookies = true;
  inputs[1].target = true;
  const char* long_bytes = inputs[0].value.data();
  const size_t long_capacity = inputs[0].value.capacity();
  auto held = HeldSecrets::Hold(&inputs);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  // The inputs' buffers (still the strings' own) hold zeros only.
  for (const auto& in : inputs) EXPECT_TRUE(in.value.empty());
  EXPECT_EQ(inputs[0].value.data(), long_bytes);
  EXPECT_EQ(std::string(long_bytes, long_capacity), std::string(long_capacity, '\0'));
  EXPECT_EQ(std::string(inputs[1].value.data(), 5), std::string(5, '\0'));

  ASSERT_EQ((*held)->size(), 2u);
  const auto& e = (*held)->entries();
  EXPECT_EQ(e[0].name, "GH");
  EXPECT_EQ(e[0].value.view(), long_value);
  EXPECT_EQ(e[1].value.view(), "short");
  EXPECT_EQ(e[1].hosts, std::vector<std::string>{"*.b.test"});
  EXPECT_TRUE(e[1].body);
  EXPECT_TRUE(e[1].keep_cookies);
  EXPECT_TRUE(e[1].target);
  EXPECT_FALSE(e[0].target);
  for (const auto& entry : e) {
    std::string flags = VmFlagsOf(entry.value.view().data()).value_or("");
    EXPECT_NE(flags.find(" dd"), std::string::npos) << flags;
  }
}

// A VM's set made from held secrets, as for each VM of a run: the held values stay whole
// (the next VM needs them) and the set's are in pages of their own.
TEST(SecretsTest, ASetMadeFromHeldSecretsCopiesPagesToPagesAndChecksAsFromInputs) {
  const std::string value = "0123456789abcdef0123456789abcdef";
  std::vector<SecretInput> inputs = {Input("TOKEN", value, {"api.example.com"})};
  inputs[0].target = true;
  auto held = HeldSecrets::Hold(&inputs);
  ASSERT_TRUE(held.ok());
  for (int vm = 0; vm < 2; ++vm) {
    auto set = SecretSet::Make(**held);
    ASSERT_TRUE(set.ok()) << set.status().ToString();
    const Secret& s = (*set)->secrets()[0];
    EXPECT_EQ(s.value.view(), value);
    EXPECT_NE(s.value.view().data(), (*held)->entries()[0].value.view().data());
    EXPECT_NE(VmFlagsOf(s.value.view().data()).value_or("").find(" dd"), std::string::npos);
    EXPECT_EQ(s.placeholder.size(), value.size());
    EXPECT_TRUE(s.BoundTo("api.example.com"));
    EXPECT_TRUE(s.target);
  }
  EXPECT_EQ((*held)->entries()[0].value.view(), value);
  // Held secrets are checked when a set is made, with the same errors, never quoting a value.
  std::vector<SecretInput> bad = {Input("T", "sekrit-value-77", {"a.test:443"})};
  auto bad_held = HeldSecrets::Hold(&bad);
  ASSERT_TRUE(bad_held.ok());
  auto refused = SecretSet::Make(**bad_held);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("has a port"), std::string::npos);
  EXPECT_EQ(refused.status().message().find("sekrit"), std::string::npos);
}

// A header line built around a value: one piece, and NUL-terminated even when the text is
// exactly a page long.
TEST(SecretsTest, AJoinedValueIsOnePieceAndNulTerminated) {
  auto line = SecretValue::Join("x-api-key: ", "sk-123");
  ASSERT_TRUE(line.ok());
  EXPECT_EQ(line->view(), "x-api-key: sk-123");
  EXPECT_STREQ(line->c_str(), "x-api-key: sk-123");
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  for (size_t size : {page - 1, page, page + 1}) {
    std::string value(size - 3, 'k');
    auto v = SecretValue::Join("h: ", value);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(std::strlen(v->c_str()), size);
  }
  SecretValue none;
  EXPECT_TRUE(none.empty());
  EXPECT_STREQ(none.c_str(), "");
}

}  // namespace
}  // namespace trybox::egress
