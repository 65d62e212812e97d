#include "guest/dns.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>
#include <vector>

namespace trybox::guest {
namespace {

// A query as glibc sends it: id, RD, one question, and an EDNS OPT record.
std::string Query(uint16_t id, const std::vector<std::string>& labels, uint16_t type,
                  bool with_opt = true) {
  std::string q;
  q += static_cast<char>(id >> 8);
  q += static_cast<char>(id & 0xff);
  q += '\x01';  // RD
  q += '\x00';
  q += std::string("\x00\x01", 2);                                          // QD
  q += std::string("\x00\x00\x00\x00", 4);                                  // AN, NS
  q += with_opt ? std::string("\x00\x01", 2) : std::string("\x00\x00", 2);  // AR
  for (const auto& l : labels) {
    q += static_cast<char>(l.size());
    q += l;
  }
  q += '\0';
  q += static_cast<char>(type >> 8);
  q += static_cast<char>(type & 0xff);
  q += std::string("\x00\x01", 2);  // IN
  if (with_opt) q += std::string("\x00\x00\x29\x04\xd0\x00\x00\x00\x00\x00\x00", 11);
  return q;
}

uint16_t U16(const std::string& s, size_t at) {
  return static_cast<uint16_t>((static_cast<uint8_t>(s[at]) << 8) |
                               static_cast<uint8_t>(s[at + 1]));
}

TEST(DnsQuery, ParsesWhatAStubResolverSendsAndLowercasesTheName) {
  auto q = ParseDnsQuery(Query(0xBEEF, {"API", "Example", "com"}, kDnsTypeA));
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->id, 0xBEEF);
  EXPECT_TRUE(q->recursion_desired);
  EXPECT_EQ(q->name, "api.example.com");
  EXPECT_EQ(q->qtype, kDnsTypeA);
  EXPECT_EQ(q->qclass, kDnsClassIn);
  EXPECT_EQ(q->question.size(), 1 + 3 + 1 + 7 + 1 + 3 + 1 + 4u);
}

TEST(DnsQuery, AnAnswerCarriesOnePoolAddressUnderTheQuestionsName) {
  auto q = ParseDnsQuery(Query(7, {"upstream", "test"}, kDnsTypeA));
  ASSERT_TRUE(q.ok());
  std::string a = DnsAnswer(*q, DnsRcode::kNoError, 0xC6120001, 10);
  EXPECT_EQ(U16(a, 0), 7);
  EXPECT_EQ(static_cast<uint8_t>(a[2]), 0x81);  // QR, RD
  EXPECT_EQ(static_cast<uint8_t>(a[3]), 0x80);  // RA, NOERROR
  EXPECT_EQ(U16(a, 4), 1);                      // one question
  EXPECT_EQ(U16(a, 6), 1);                      // one answer
  EXPECT_EQ(U16(a, 10), 0);                     // no additional records
  size_t at = 12 + q->question.size();
  ASSERT_EQ(a.size(), at + 16);
  EXPECT_EQ(U16(a, at), 0xC00C);  // the question's name
  EXPECT_EQ(U16(a, at + 2), kDnsTypeA);
  EXPECT_EQ(U16(a, at + 8), 10);  // TTL, low half
  EXPECT_EQ(U16(a, at + 10), 4);
  EXPECT_EQ(a.substr(at + 12), std::string("\xc6\x12\x00\x01", 4));
  // Refused: NXDOMAIN, the question echoed, nothing else.
  std::string nx = DnsAnswer(*q, DnsRcode::kNxDomain);
  EXPECT_EQ(static_cast<uint8_t>(nx[3]) & 0xf, 3);
  EXPECT_EQ(U16(nx, 6), 0);
  EXPECT_EQ(nx.size(), 12 + q->question.size());
}

TEST(DnsQuery, WhatItCannotAnswerIsNamedNotGuessed) {
  uint16_t id = 0;
  EXPECT_FALSE(ParseDnsQuery("short", &id).ok());
  std::string response = Query(9, {"a"}, kDnsTypeA);
  response[2] = static_cast<char>(0x81);
  EXPECT_FALSE(ParseDnsQuery(response, &id).ok());
  EXPECT_EQ(id, 9);  // known, so the caller can answer FORMERR under it
  std::string two = Query(9, {"a"}, kDnsTypeA);
  two[5] = 2;
  EXPECT_NE(ParseDnsQuery(two).status().message().find("exactly one question"), std::string::npos);
  std::string compressed = Query(9, {"a"}, kDnsTypeA, false);
  compressed[12] = static_cast<char>(0xC0);
  EXPECT_NE(ParseDnsQuery(compressed).status().message().find("compression"), std::string::npos);
  std::string cut = Query(9, {"abc"}, kDnsTypeA, false);
  cut.resize(14);
  EXPECT_NE(ParseDnsQuery(cut).status().message().find("cut short"), std::string::npos);
  std::string status_query = Query(9, {"a"}, kDnsTypeA);
  status_query[2] = static_cast<char>(2 << 3);  // opcode 2 (STATUS)
  EXPECT_NE(ParseDnsQuery(status_query).status().message().find("opcode 2"), std::string::npos);
  std::vector<std::string> long_name(5, std::string(60, 'a'));
  EXPECT_NE(ParseDnsQuery(Query(9, long_name, kDnsTypeA)).status().message().find("255"),
            std::string::npos);
  std::string err = DnsError(0x1234, DnsRcode::kFormErr);
  EXPECT_EQ(err.size(), 12u);
  EXPECT_EQ(U16(err, 0), 0x1234);
  EXPECT_EQ(static_cast<uint8_t>(err[3]) & 0xf, 1);
}

TEST(NamePool, EachNameKeepsOneAddressAndEachAddressOneName) {
  NamePool pool;
  uint32_t a = pool.AddressFor("a.test").value();
  uint32_t b = pool.AddressFor("b.test").value();
  EXPECT_EQ(a, 0xC6120001u);  // 198.18.0.1
  EXPECT_NE(a, b);
  EXPECT_EQ(pool.AddressFor("a.test").value(), a);
  EXPECT_EQ(pool.NameAt(a), "a.test");
  EXPECT_EQ(pool.NameAt(b), "b.test");
  EXPECT_EQ(pool.NameAt(0xC6120063), std::nullopt);  // never given out
  EXPECT_TRUE(NamePool::Contains(0xC6120000));
  EXPECT_TRUE(NamePool::Contains(0xC613FFFF));   // 198.19.255.255
  EXPECT_FALSE(NamePool::Contains(0xC6140000));  // 198.20.0.0
  EXPECT_FALSE(NamePool::Contains(0x7F000001));
}

TEST(NamePool, SkipsNetworkAndBroadcastLookingAddressesAndEndsWithAnError) {
  NamePool pool;
  std::vector<uint32_t> given;
  for (int i = 0; i < 600; ++i) given.push_back(pool.AddressFor("n" + std::to_string(i)).value());
  for (uint32_t a : given) {
    EXPECT_NE(a & 0xff, 0u);
    EXPECT_NE(a & 0xff, 0xffu);
  }
  // 512 /24s of 254 usable addresses each.
  for (int i = 600; i < 512 * 254; ++i) ASSERT_TRUE(pool.AddressFor("n" + std::to_string(i)).ok());
  auto over = pool.AddressFor("one-more.test");
  EXPECT_EQ(over.status().code(), Code::kResourceExhausted);
  EXPECT_EQ(pool.AddressFor("n0").value(), given[0]);  // known names still answer
}

TEST(NamePool, ConcurrentLookupsOfOneNameAgree) {
  NamePool pool;
  std::vector<uint32_t> got(8);
  std::vector<std::thread> ts;
  for (int i = 0; i < 8; ++i) {
    ts.emplace_back([&, i] { got[i] = pool.AddressFor("same.test").value(); });
  }
  for (auto& t : ts) t.join();
  for (uint32_t a : got) EXPECT_EQ(a, got[0]);
}

TEST(NameDecisions, QuestionsArrivingTogetherShareOneAskAndAllowedAnswersAreKept) {
  NameDecisions d(std::chrono::hours(1));
  std::promise<void> asking, release;
  std::shared_future<void> go = release.get_future().share();
  auto slow_yes = [&](const std::string&) -> Result<bool> {
    asking.set_value();
    go.wait();
    return true;
  };
  std::thread first([&] { EXPECT_TRUE(d.Decide("a.test", slow_yes).value()); });
  asking.get_future().wait();  // the first question is with the host
  std::thread second([&] {
    // Shares the first's answer: this ask would fail the test if it ran.
    EXPECT_TRUE(d.Decide("a.test", [](const std::string&) -> Result<bool> {
                   ADD_FAILURE() << "asked twice";
                   return false;
                 }).value());
  });
  release.set_value();
  first.join();
  second.join();
  EXPECT_EQ(d.asked(), 1u);
  // Kept: asked again, the host is not.
  EXPECT_TRUE(d.Decide("a.test", [](const std::string&) -> Result<bool> { return false; }).value());
  EXPECT_EQ(d.asked(), 1u);
}

// Issue 41.12: a refusal was kept a second, so the lookup right after `trybox allow` still
// answered NXDOMAIN without asking the host.
TEST(NameDecisions, RefusalsAndErrorsAreNeverKept) {
  NameDecisions d(std::chrono::hours(1));
  int asks = 0;
  auto no = [&](const std::string&) -> Result<bool> {
    ++asks;
    return false;
  };
  EXPECT_FALSE(d.Decide("evil.test", no).value());
  EXPECT_FALSE(d.Decide("evil.test", no).value());
  EXPECT_EQ(asks, 2);  // the next lookup asks again
  // Allowed meanwhile (trybox allow): the very next lookup finds it, and keeps it.
  EXPECT_TRUE(d.Decide("evil.test", [&](const std::string&) -> Result<bool> {
                 ++asks;
                 return true;
               }).value());
  EXPECT_TRUE(d.Decide("evil.test", no).value());
  EXPECT_EQ(asks, 3);
  auto broken = [&](const std::string&) -> Result<bool> {
    ++asks;
    return Unavailable("no host session");
  };
  EXPECT_EQ(d.Decide("x.test", broken).status().code(), Code::kUnavailable);
  EXPECT_TRUE(d.Decide("x.test", [](const std::string&) -> Result<bool> { return true; }).value());
  EXPECT_EQ(asks, 4);
  EXPECT_EQ(d.asked(), 5u);
}

}  // namespace
}  // namespace trybox::guest
