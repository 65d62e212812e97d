#include "egress/hostname.h"

#include <gtest/gtest.h>

#include "egress/address.h"
#include "egress/allowlist.h"

namespace trybox::egress {
namespace {

struct Refusal {
  const char* name;  // test name suffix
  std::string host;
  const char* reason;  // substring of the refusal
};

class HostnameRefused : public ::testing::TestWithParam<Refusal> {};

TEST_P(HostnameRefused, WithItsReason) {
  auto r = CanonicalHostname(GetParam().host);
  ASSERT_FALSE(r.ok()) << GetParam().host << " was accepted as " << *r;
  EXPECT_NE(r.status().message().find(GetParam().reason), std::string::npos)
      << r.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Egress, HostnameRefused,
    ::testing::Values(Refusal{"DottedIpv4", "127.0.0.1", "IP literal"},
                      Refusal{"DecimalIpv4", "2130706433", "IP literal"},
                      Refusal{"HexIpv4", "0x7f000001", "IP literal"},
                      Refusal{"OctalIpv4", "0177.0.0.1", "IP literal"},
                      Refusal{"MixedHexShortIpv4", "0x7f.1", "IP literal"},
                      Refusal{"ShortIpv4", "127.1", "IP literal"},
                      Refusal{"ZeroPaddedIpv4", "169.254.169.0254", "IP literal"},
                      Refusal{"Ipv4TrailingDot", "10.0.0.1.", "IP literal"},
                      Refusal{"BracketedIpv6", "[::1]", "IPv6"}, Refusal{"BareIpv6", "::1", "IPv6"},
                      Refusal{"V4MappedIpv6", "::ffff:127.0.0.1", "IPv6"},
                      Refusal{"Userinfo", "allowed.test@evil.test", "userinfo"},
                      Refusal{"PathSuffixTrick", "evil.test/allowed.test", "'/'"},
                      Refusal{"BackslashTrick", "evil.test\\allowed.test", "'\\'"},
                      Refusal{"PercentEncodedDot", "allowed.test%2eevil.test", "'%'"},
                      Refusal{"QueryTrick", "evil.test?allowed.test", "'?'"},
                      Refusal{"FragmentTrick", "evil.test#allowed.test", "'#'"},
                      Refusal{"Space", "evil.test allowed.test", "' '"},
                      Refusal{"NulByte", std::string("allowed.test\0.evil", 18), "not allowed"},
                      Refusal{"Underscore", "under_score.test", "'_'"},
                      Refusal{"NonAsciiUtf8",
                              "b\xc3\xbc"
                              "cher.test",
                              "non-ASCII"},
                      Refusal{"NonAsciiFullwidthDot", "allowed\xef\xbc\x8etest", "non-ASCII"},
                      Refusal{"Empty", "", "empty"}, Refusal{"OnlyDot", ".", "empty"},
                      Refusal{"DoubleTrailingDot", "allowed.test..", "empty label"},
                      Refusal{"LeadingDot", ".allowed.test", "empty label"},
                      Refusal{"InnerEmptyLabel", "allowed..test", "empty label"},
                      Refusal{"LabelOver63", std::string(64, 'a') + ".test",
                              "label longer than 63"},
                      Refusal{"NameOver253",
                              std::string(63, 'a') + "." + std::string(63, 'b') + "." +
                                  std::string(63, 'c') + "." + std::string(63, 'd') + ".test",
                              "longer than 253"},
                      Refusal{"LeadingHyphen", "-evil.test", "'-'"},
                      Refusal{"TrailingHyphen", "evil-.test", "'-'"},
                      Refusal{"PortInHost", "allowed.test:443", "a port"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(EgressHostname, MixedCaseIsLowercased) {
  EXPECT_EQ(*CanonicalHostname("API.GitHub.Com"), "api.github.com");
}

TEST(EgressHostname, OneTrailingDotIsTheSameName) {
  EXPECT_EQ(*CanonicalHostname("api.github.com."), "api.github.com");
}

TEST(EgressHostname, PunycodeAndDigitsInLabelsAreHostnames) {
  EXPECT_EQ(*CanonicalHostname("xn--bcher-kva.test"), "xn--bcher-kva.test");
  EXPECT_EQ(*CanonicalHostname("1e100.net"), "1e100.net");
  EXPECT_EQ(*CanonicalHostname("123.example.com"), "123.example.com");
  EXPECT_EQ(*CanonicalHostname(std::string(63, 'a') + ".test"), std::string(63, 'a') + ".test");
}

TEST(EgressAllowList, ExactEntryMatchesOnlyThatNameOnPort443) {
  auto l = *AllowList::Parse({"allowed.test"});
  EXPECT_EQ(l.Check("allowed.test", 443), "");
  EXPECT_NE(l.Check("allowed.test", 80).find("port 80 is not allowed"), std::string::npos);
  EXPECT_NE(l.Check("sub.allowed.test", 443).find("not on the VM's allow-list"), std::string::npos);
  EXPECT_NE(l.Check("allowed.test.evil.test", 443), "");
  EXPECT_NE(l.Check("evilallowed.test", 443), "");
}

TEST(EgressAllowList, WildcardMatchesSubdomainsOnly) {
  auto l = *AllowList::Parse({"*.example.test"});
  EXPECT_EQ(l.Check("a.example.test", 443), "");
  EXPECT_EQ(l.Check("a.b.example.test", 443), "");
  EXPECT_NE(l.Check("example.test", 443), "");
  EXPECT_NE(l.Check("evilexample.test", 443), "");
  EXPECT_NE(l.Check("example.test.evil.test", 443), "");
}

TEST(EgressAllowList, PerEntryPortAndCanonicalEntries) {
  auto l = *AllowList::Parse({"Models.Local.:8080", "api.test"});
  EXPECT_EQ(l.Check("models.local", 8080), "");
  EXPECT_NE(l.Check("models.local", 443), "");
  EXPECT_EQ(l.ToStrings(), (std::vector<std::string>{"models.local:8080", "api.test:443"}));
}

TEST(EgressAllowList, BadEntriesAreRefusedNamingThem) {
  for (const char* bad : {"*.com", "1.2.3.4", "host.test:0", "host.test:99999", "host.test:x",
                          "a@b.test", "[::1]:443", "*.*.test", ""}) {
    auto r = ParseAllowEntry(bad);
    EXPECT_FALSE(r.ok()) << bad;
  }
}

TEST(EgressReach, DenyEntriesWinInEitherModeAndCoverEveryPortWithoutOne) {
  Reach r;
  r.allow = *AllowList::Parse({"api.test", "*.example.test:8080"});
  r.deny.push_back(*ParseDenyEntry("bad.example.test"));
  EXPECT_EQ(r.Check("api.test", 443), "");
  EXPECT_EQ(r.Check("other.test", 443), "other.test is not on the VM's allow-list");
  EXPECT_EQ(r.Check("a.example.test", 8080), "");
  EXPECT_EQ(r.Check("bad.example.test", 8080),
            "bad.example.test:8080 is denied for this VM (deny bad.example.test)");
  r.mode = EgressMode::kInternet;
  EXPECT_EQ(r.Check("other.test", 22), "");  // any host, any port
  EXPECT_NE(r.Check("bad.example.test", 1), "");
  r.deny = {*ParseDenyEntry("*.tracker.test:443")};
  EXPECT_NE(r.Check("x.tracker.test", 443), "");
  EXPECT_EQ(r.Check("x.tracker.test", 80), "");
  EXPECT_EQ(r.Check("tracker.test", 443), "");  // a wildcard covers subdomains only
  EXPECT_EQ(r.AllowedBecause(), "internet mode: any public host");
}

TEST(EgressReach, AllowAndDenyOnARunningVmUndoEachOther) {
  Reach r;
  r.allow = *AllowList::Parse({"api.test"});
  EXPECT_TRUE(r.Deny(*ParseDenyEntry("api.test")));  // drops the allow entry, lists the deny
  EXPECT_EQ(r.allow.ToStrings(), std::vector<std::string>{});
  EXPECT_EQ(r.DenyStrings(), std::vector<std::string>{"api.test"});
  EXPECT_FALSE(r.Deny(*ParseDenyEntry("api.test")));  // nothing new
  EXPECT_NE(r.Check("api.test", 443), "");
  EXPECT_TRUE(r.Allow(*ParseAllowEntry("api.test:8443")));  // the every-port deny goes
  EXPECT_EQ(r.DenyStrings(), std::vector<std::string>{});
  EXPECT_EQ(r.allow.ToStrings(), std::vector<std::string>{"api.test:8443"});
  EXPECT_EQ(r.Check("api.test", 8443), "");
  EXPECT_FALSE(r.Allow(*ParseAllowEntry("api.test:8443")));
  // A deny of one port leaves the host's other allow entries.
  EXPECT_TRUE(r.Allow(*ParseAllowEntry("api.test")));
  EXPECT_TRUE(r.Deny(*ParseDenyEntry("api.test:8443")));
  EXPECT_EQ(r.allow.ToStrings(), std::vector<std::string>{"api.test:443"});
  EXPECT_EQ(r.Check("api.test", 443), "");
}

TEST(EgressReach, BadDenyEntriesAreRefusedNamingThem) {
  auto bad = ParseDenyEntry("10.0.0.1");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("deny entry"), std::string::npos) << bad.status().message();
  bad = ParseDenyEntry("*.com");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("deny entry '*.com'"), std::string::npos);
  EXPECT_FALSE(ParseDenyEntry("a.test:0").ok());
  EXPECT_EQ(ParseDenyEntry("a.test")->port, 0);
  EXPECT_EQ(ParseDenyEntry("a.test:22")->ToString(), "a.test:22");
}

TEST(EgressAllowList, AddressOverrideMatchesExactAddressAndPort) {
  auto o = *AddressOverride::Parse("127.0.0.1:8080");
  sockaddr_storage a = o.addr;
  EXPECT_TRUE(o.Matches(a));
  reinterpret_cast<sockaddr_in*>(&a)->sin_port = htons(8081);
  EXPECT_FALSE(o.Matches(a));
  EXPECT_TRUE(AddressOverride::Parse("[::1]:11434").ok());
  EXPECT_FALSE(AddressOverride::Parse("localhost:80").ok());
  EXPECT_FALSE(AddressOverride::Parse("127.0.0.1").ok());
}

struct Classified {
  const char* name;
  const char* addr;
  AddressClass want;
};

class AddressClassified : public ::testing::TestWithParam<Classified> {};

TEST_P(AddressClassified, AsExpected) {
  sockaddr_storage s{};
  std::string a = GetParam().addr;
  auto o =
      AddressOverride::Parse(a.find(':') == std::string::npos ? a + ":443" : "[" + a + "]:443");
  ASSERT_TRUE(o.ok()) << a;
  s = o->addr;
  EXPECT_EQ(AddressClassName(Classify(s)), std::string(AddressClassName(GetParam().want))) << a;
}

INSTANTIATE_TEST_SUITE_P(
    Egress, AddressClassified,
    ::testing::Values(Classified{"Loopback", "127.0.0.1", AddressClass::kLoopback},
                      Classified{"LoopbackNet", "127.45.6.7", AddressClass::kLoopback},
                      Classified{"Rfc1918Ten", "10.1.2.3", AddressClass::kPrivate},
                      Classified{"Rfc1918OneSevenTwo", "172.31.255.1", AddressClass::kPrivate},
                      Classified{"Rfc1918OneNineTwo", "192.168.0.1", AddressClass::kPrivate},
                      Classified{"LinkLocal", "169.254.1.1", AddressClass::kLinkLocal},
                      Classified{"AwsGcpMetadata", "169.254.169.254", AddressClass::kMetadata},
                      Classified{"EcsMetadata", "169.254.170.2", AddressClass::kMetadata},
                      Classified{"AlibabaMetadata", "100.100.100.200", AddressClass::kMetadata},
                      Classified{"Cgnat", "100.64.0.1", AddressClass::kCgnat},
                      Classified{"Multicast", "224.0.0.251", AddressClass::kMulticast},
                      Classified{"Unspecified", "0.0.0.0", AddressClass::kUnspecified},
                      Classified{"ThisNetwork", "0.1.2.3", AddressClass::kUnspecified},
                      Classified{"Broadcast", "255.255.255.255", AddressClass::kBroadcast},
                      Classified{"ClassE", "240.0.0.1", AddressClass::kReserved},
                      Classified{"Documentation", "192.0.2.1", AddressClass::kReserved},
                      Classified{"PublicV4", "93.184.216.34", AddressClass::kPublic},
                      Classified{"Ipv6Loopback", "::1", AddressClass::kLoopback},
                      Classified{"Ipv6Unspecified", "::", AddressClass::kUnspecified},
                      Classified{"V4MappedLoopback", "::ffff:127.0.0.1", AddressClass::kLoopback},
                      Classified{"V4MappedMetadata", "::ffff:169.254.169.254",
                                 AddressClass::kMetadata},
                      Classified{"V4Compatible", "::127.0.0.1", AddressClass::kReserved},
                      Classified{"Nat64Loopback", "64:ff9b::7f00:1", AddressClass::kLoopback},
                      Classified{"SixToFourPrivate", "2002:c0a8:1::1", AddressClass::kPrivate},
                      Classified{"UniqueLocal", "fd12:3456::1", AddressClass::kPrivate},
                      Classified{"Ec2Ipv6Metadata", "fd00:ec2::254", AddressClass::kMetadata},
                      Classified{"Ipv6LinkLocal", "fe80::1", AddressClass::kLinkLocal},
                      Classified{"Ipv6LinkLocalUpper", "febf::1", AddressClass::kLinkLocal},
                      Classified{"SiteLocal", "fec0::1", AddressClass::kPrivate},
                      Classified{"Ipv6Multicast", "ff02::1", AddressClass::kMulticast},
                      Classified{"Teredo", "2001::1", AddressClass::kReserved},
                      Classified{"Ipv6Documentation", "2001:db8::1", AddressClass::kReserved},
                      Classified{"PublicV6", "2606:4700::1111", AddressClass::kPublic}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace trybox::egress
