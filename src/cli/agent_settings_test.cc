#include "cli/agent_settings.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>

#include "util/fd.h"

namespace trybox::cli {
namespace {

class AgentSettingsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = TempDir::Make("/tmp", "tbx-settings-");
    ASSERT_TRUE(dir.ok());
    dir_.emplace(std::move(*dir));
    paths_.config = dir_->path();
  }
  EnvLookup Env() {
    return [this](const std::string& k) {
      auto it = env_.find(k);
      return it == env_.end() ? std::string() : it->second;
    };
  }
  void WriteConfig(const std::string& text) {
    ASSERT_TRUE(WriteFileAtomic(paths_.config + "/agent.json", text, 0600).ok());
  }
  std::optional<TempDir> dir_;
  Paths paths_;
  std::map<std::string, std::string> env_;
};

TEST_F(AgentSettingsTest, NothingConfiguredNamesWhatToSet) {
  auto m = ResolveModel(paths_, {}, Env());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kNotFound);
  EXPECT_NE(m.status().message().find("ANTHROPIC_API_KEY"), std::string::npos);
}

TEST_F(AgentSettingsTest, AnthropicFromItsOwnVariables) {
  env_ = {{"ANTHROPIC_API_KEY", "sk-ant-secret"}, {"ANTHROPIC_MODEL", "m1"}};
  auto m = ResolveModel(paths_, {}, Env());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)["provider"], "anthropic");
  EXPECT_EQ((*m)["base_url"], "https://api.anthropic.com");
  EXPECT_EQ((*m)["api_key"], "sk-ant-secret");
  EXPECT_EQ((*m)["model"], "m1");
}

TEST_F(AgentSettingsTest, OpenAiCompatibleWithoutKey) {
  env_ = {{"OPENAI_BASE_URL", "http://127.0.0.1:11434/v1"}, {"OPENAI_MODEL", "qwen"}};
  auto m = ResolveModel(paths_, {}, Env());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)["provider"], "openai");
  EXPECT_EQ((*m)["base_url"], "http://127.0.0.1:11434/v1");
  EXPECT_EQ((*m)["api_key"], "");
}

TEST_F(AgentSettingsTest, FlagsWinOverEnvironmentAndEnvironmentOverConfig) {
  WriteConfig(
      R"({"provider":"anthropic","openai":{"model":"from-config","base_url":"http://c/v1"}})");
  env_ = {{"OPENAI_MODEL", "from-env"}};
  auto m = ResolveModel(paths_, {.provider = "openai"}, Env());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)["model"], "from-env");
  EXPECT_EQ((*m)["base_url"], "http://c/v1");
  m = ResolveModel(paths_, {.provider = "openai", .model = "from-flag"}, Env());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)["model"], "from-flag");
}

TEST_F(AgentSettingsTest, MissingModelIsNotFound) {
  env_ = {{"ANTHROPIC_API_KEY", "k"}};
  auto m = ResolveModel(paths_, {}, Env());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("ANTHROPIC_MODEL"), std::string::npos);
}

TEST_F(AgentSettingsTest, UnknownProviderAndBadConfigAreRefusedWithoutQuotingValues) {
  auto m = ResolveModel(paths_, {.provider = "gemini"}, Env());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kInvalidArgument);
  WriteConfig(R"({"anthropic":{"api_key":12345}})");
  m = ResolveModel(paths_, {}, Env());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message().find("12345"), std::string::npos);
  WriteConfig(R"({"anthropic":{"apikey":"sk-secret"}})");
  m = ResolveModel(paths_, {}, Env());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message().find("sk-secret"), std::string::npos);
  WriteConfig("{not json");
  m = ResolveModel(paths_, {}, Env());
  ASSERT_FALSE(m.ok());
}

TEST_F(AgentSettingsTest, InternetComesFromTheFlagElseAgentJsonElseOff) {
  EXPECT_FALSE(*ResolveAgentInternet(paths_, std::nullopt));
  WriteConfig(R"({"internet": true})");
  EXPECT_TRUE(*ResolveAgentInternet(paths_, std::nullopt));
  EXPECT_FALSE(*ResolveAgentInternet(paths_, false));
  WriteConfig(R"({"internet": "yes"})");
  auto bad = ResolveAgentInternet(paths_, std::nullopt);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("internet must be true or false"), std::string::npos);
  EXPECT_TRUE(*ResolveAgentInternet(paths_, true));  // the flag needs no file
}

}  // namespace
}  // namespace trybox::cli
