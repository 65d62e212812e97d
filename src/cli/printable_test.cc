// What trybox itself prints of a guest's strings (issue 41, items 3 and 9; docs/security.md,
// "What the CLI prints"): file names in `diff` and the collect summary, hosts in `audit`,
// error messages. A scripted daemon answers with the names a hostile guest chose; the
// output must hold no control byte but the line ends trybox writes itself, and no line the
// guest made.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "cli/cli.h"
#include "cli/client.h"
#include "cli/testing.h"

namespace trybox::cli {
namespace {

using testing::Home;

// Erases the line, sets the window title, writes the clipboard (OSC 52), then forges a line.
const std::string kHostileName =
    "x\x1b[2K\r\x1b]0;owned\x07\x1b]52;c;aGk=\x07\ntrybox: all clear\xe2\x80\xae"
    "cod.exe";

struct Session {
  explicit Session(testing::ScriptedDaemon::Script script) {
    auto d = testing::ScriptedDaemon::Start(home.paths, std::move(script));
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    if (d.ok()) daemon = std::move(*d);
    auto c = Client::Connect(home.paths, false);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (c.ok()) client = std::move(*c);
  }
  int Run(std::vector<std::string> args) {
    args.insert(args.begin(), "trybox");
    auto inv = Parse(args);
    EXPECT_TRUE(inv.ok()) << inv.status().ToString();
    return inv.ok() ? RunWithClient(*client, *inv, out, err) : -1;
  }
  Home home;
  std::unique_ptr<testing::ScriptedDaemon> daemon;
  std::unique_ptr<Client> client;
  std::ostringstream out, err;
};

// The bytes below 0x20 (but '\n'), DEL, C1 controls and U+202E found in `text`.
std::string ControlsIn(const std::string& text) {
  std::string found;
  for (size_t i = 0; i < text.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 && c != '\n') || c == 0x7f) found += "byte " + std::to_string(c) + " ";
    if (c == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
        static_cast<unsigned char>(text[i + 1]) <= 0x9f) {
      found += "C1 ";
    }
    if (text.compare(i, 3, "\xe2\x80\xae") == 0) found += "U+202E ";
  }
  return found;
}

bool HasLineStartingWith(const std::string& text, const std::string& prefix) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

size_t Lines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

TEST(PrintableTest, DiffAndCollectShowAGuestsFileNamesEscapedOnTheirOwnLine) {
  Session s([](std::shared_ptr<channel::Stream> st, const Json&) {
    Json c = {
        {"vm", "vm1"},
        {"counts",
         {{"added", 2}, {"modified", 0}, {"deleted", 0}, {"renamed", 1}, {"mode_changed", 0}}},
        {"changes",
         {{{"change", "added"}, {"path", ".github/workflows/ci.yml"}, {"new_size", 10}},
          {{"change", "added"}, {"path", kHostileName}, {"new_size", 1}},
          {{"change", "renamed"}, {"from", kHostileName}, {"path", "b"}, {"new_size", 1}}}},
        {"skipped", {{{"path", kHostileName}, {"reason", "a fifo\x1b[1A"}}}},
        {"commit", "abc"},
        {"branch", "trybox/vm1"},
        {"note", ""}};
    (void)st->End({{"ok", true}, {"collect", c}});
  });
  ASSERT_EQ(s.Run({"diff", "vm1"}), 0) << s.err.str();
  const std::string text = s.out.str();
  EXPECT_EQ(ControlsIn(text), "") << text;
  EXPECT_FALSE(HasLineStartingWith(text, "trybox:")) << text;
  // 3 changes, the summary line, one skipped entry, the commit line.
  EXPECT_EQ(Lines(text), 6u) << text;
  EXPECT_NE(text.find("A  .github/workflows/ci.yml (10 bytes)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("A  x\\u{001B}[2K\\u{000D}\\u{001B}]0;owned\\u{0007}\\u{001B}]52;c;aGk="
                      "\\u{0007}\\u{000A}trybox: all clear\\u{202E}cod.exe (1 bytes)\n"),
            std::string::npos)
      << text;
}

TEST(PrintableTest, AuditShowsAGuestsHostEscaped) {
  Session s([](std::shared_ptr<channel::Stream> st, const Json&) {
    Json row = {{"id", 1},
                {"vm", "vm1"},
                {"started_at", 1.7e9},
                {"ended_at", 1.7e9},
                {"method", "CONNECT"},
                {"host", "\x1b]52;c;aGk=\x07\nok.test"},
                {"port", 443},
                {"address", ""},
                {"verdict", "refused"},
                {"reason", "not on the list: \x1b[2K\rtrybox: fine"},
                {"status", 403},
                {"bytes_up", 0},
                {"bytes_down", 0}};
    (void)st->End({{"ok", true}, {"egress", {row}}});
  });
  ASSERT_EQ(s.Run({"audit"}), 0) << s.err.str();
  const std::string text = s.out.str();
  EXPECT_EQ(ControlsIn(text), "") << text;
  EXPECT_EQ(Lines(text), 2u) << text;  // the header and the row
  EXPECT_NE(text.find("\\u{001B}]52;c;aGk=\\u{0007}"), std::string::npos) << text;
  EXPECT_NE(text.find("not on the list: \\u{001B}[2K\\u{000D}trybox: fine\n"), std::string::npos)
      << text;
}

TEST(PrintableTest, AnErrorNamingAGuestsFileStaysOneLine) {
  Session s([](std::shared_ptr<channel::Stream> st, const Json&) {
    (void)st->End(
        {{"ok", false},
         {"error", {{"code", "NOT_FOUND"}, {"message", "no such file: " + kHostileName}}}});
  });
  EXPECT_EQ(s.Run({"diff", "vm1"}), 125);
  const std::string text = s.err.str();
  EXPECT_EQ(ControlsIn(text), "") << text;
  EXPECT_EQ(Lines(text), 1u) << text;
  EXPECT_EQ(text.rfind("trybox: no such file: x\\u{001B}[2K", 0), 0u) << text;
}

}  // namespace
}  // namespace trybox::cli
