// RelayHttp between a test guest and a test upstream, each over a real socketpair wrapped in
// FdStream. The test writes raw HTTP bytes as the guest, reads what reaches the upstream,
// answers as the upstream and reads what the guest gets; the relay runs on its own thread.
#include "egress/intercept.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <memory>
#include <thread>

#include "egress/intercept_test_util.h"
#include "util/fd.h"
#include "util/utf8.h"

namespace trybox::egress {
namespace {

constexpr char kHost[] = "api.test";
constexpr char kValue[] = "sk-live-0123456789abcdefXYZ";

class InterceptTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ::signal(SIGPIPE, SIG_IGN); }

  void Start(std::vector<SecretInput> inputs, InterceptLimits limits = {},
             std::vector<std::string> rules = {}) {
    MakeSecretsAndRules(std::move(inputs), rules, &secrets_, &rules_);
    if (HasFatalFailure()) return;
    int g[2], u[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, g), 0);
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, u), 0);
    guest_.Reset(g[0]);
    relay_guest_.Reset(g[1]);
    upstream_.Reset(u[0]);
    relay_upstream_.Reset(u[1]);
    guest_stream_ = std::make_unique<FdStream>(g[1]);
    upstream_stream_ = std::make_unique<FdStream>(u[1]);
    relay_ = std::thread([this, limits] {
      result_ = RelayHttp(*guest_stream_, *upstream_stream_, *secrets_, kHost, limits,
                          rules_.empty() ? nullptr : &rules_);
    });
  }

  void TearDown() override {
    if (!relay_.joinable()) return;
    ::shutdown(guest_.get(), SHUT_RDWR);
    ::shutdown(upstream_.get(), SHUT_RDWR);
    relay_.join();
  }

  InterceptResult Join() {
    relay_.join();
    return result_;
  }

  // Ends the connection the clean way: the guest closes its side, which reaches the upstream,
  // which closes its side, which reaches the guest.
  InterceptResult CloseAndJoin() {
    ::shutdown(guest(), SHUT_WR);
    EXPECT_EQ(ReadUntilEof(upstream()), "");
    ::shutdown(upstream(), SHUT_WR);
    EXPECT_EQ(ReadUntilEof(guest()), "");
    return Join();
  }

  std::string Placeholder(const std::string& name) { return secrets_->GuestEnv().at(name); }
  int guest() const { return guest_.get(); }
  int upstream() const { return upstream_.get(); }

 private:
  std::shared_ptr<const SecretSet> secrets_;
  HttpRules rules_;
  UniqueFd guest_, relay_guest_, upstream_, relay_upstream_;
  std::unique_ptr<FdStream> guest_stream_, upstream_stream_;
  std::thread relay_;
  InterceptResult result_;
};

TEST_F(InterceptTest, APlaceholderInABearerHeaderReachesTheBoundHostAsTheRealValue) {
  Start({Declare("API_KEY", kValue, {kHost})});
  std::string ph = Placeholder("API_KEY");
  Write(guest(), "GET /v1/models HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + ph +
                     "\r\nX-Note:  kept as sent\r\n\r\n");
  EXPECT_EQ(ReadHead(upstream()),
            std::string("GET /v1/models HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer ") +
                kValue + "\r\nX-Note: kept as sent\r\n\r\n");
  std::string response = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
  Write(upstream(), response);
  EXPECT_EQ(ReadMessage(guest()), response);
  InterceptResult r = CloseAndJoin();
  EXPECT_EQ(r.requests, 1);
  EXPECT_EQ(r.substitutions, (std::map<std::string, int>{{"API_KEY", 1}}));
  EXPECT_EQ(r.refused_status, 0);
  EXPECT_EQ(r.error, "");
  EXPECT_FALSE(r.upgraded);
  EXPECT_GT(r.bytes_up, 0);
  EXPECT_EQ(r.bytes_down, static_cast<int64_t>(response.size()));
  ExpectNoValue(r, kValue);
}

TEST_F(InterceptTest, APlaceholderInTheQueryIsReplacedWithReservedBytesPercentEncoded) {
  Start({Declare("KEY", "k3y/with+reserved=chars&more", {kHost}, false, false, /*target=*/true)});
  Write(guest(),
        "GET /search?key=" + Placeholder("KEY") + "&q=1 HTTP/1.1\r\nHost: api.test\r\n\r\n");
  EXPECT_EQ(ReadHead(upstream()),
            "GET /search?key=k3y%2Fwith%2Breserved%3Dchars%26more&q=1 HTTP/1.1\r\n"
            "Host: api.test\r\n\r\n");
  Write(upstream(), "HTTP/1.1 204 No Content\r\n\r\n");
  EXPECT_EQ(ReadHead(guest()), "HTTP/1.1 204 No Content\r\n\r\n");
  InterceptResult r = CloseAndJoin();
  EXPECT_EQ(r.substitutions.at("KEY"), 1);
  ExpectNoValue(r, "k3y/with+reserved=chars&more");
}

TEST_F(InterceptTest, BasicCredentialsAreDecodedSubstitutedAndReencoded) {
  Start({Declare("PASSWORD", "hunter2-hunter2-x", {kHost})});
  // Sent without its padding, which some clients drop; it arrives canonical.
  std::string creds = Base64Encode("alice:" + Placeholder("PASSWORD"));
  while (creds.back() == '=') creds.pop_back();
  Write(guest(), "GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: Basic " + creds + "\r\n\r\n");
  EXPECT_EQ(ReadHead(upstream()), "GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: Basic " +
                                      Base64Encode("alice:hunter2-hunter2-x") + "\r\n\r\n");
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(ReadHead(guest()), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  InterceptResult r = CloseAndJoin();
  EXPECT_EQ(r.substitutions.at("PASSWORD"), 1);
}

TEST_F(InterceptTest, AForeignPlaceholderIsRefusedWith403AndNothingReachesTheUpstream) {
  Start({Declare("API_KEY", kValue, {kHost}),
         Declare("OTHER_KEY", "other-secret-value-42", {"other.test"})});
  Write(guest(), "GET /?k=" + Placeholder("API_KEY") + " HTTP/1.1\r\nHost: api.test\r\nX-Key: " +
                     Placeholder("OTHER_KEY") + "\r\n\r\n");
  std::string reply = ReadUntilEof(guest());
  EXPECT_EQ(reply.rfind("HTTP/1.1 403 Forbidden\r\n", 0), 0u) << reply;
  EXPECT_NE(reply.find("\r\nX-Trybox-Reason: the placeholder of secret OTHER_KEY may go only to "
                       "its hosts\r\n"),
            std::string::npos)
      << reply;
  EXPECT_NE(reply.find("\r\nConnection: close\r\n"), std::string::npos);
  EXPECT_EQ(reply.find("other-secret-value-42"), std::string::npos);
  EXPECT_EQ(reply.find(kValue), std::string::npos);
  EXPECT_EQ(ReadUntilEof(upstream()), "");
  InterceptResult r = Join();
  EXPECT_EQ(r.requests, 0);
  EXPECT_EQ(r.refused_status, 403);
  EXPECT_NE(r.refused_reason.find("OTHER_KEY"), std::string::npos);
  EXPECT_TRUE(r.substitutions.empty());
  ExpectNoValue(r, "other-secret-value-42");
  ExpectNoValue(r, kValue);
}

TEST_F(InterceptTest, AForeignPlaceholderInsideBasicCredentialsIsRefused) {
  Start({Declare("OTHER_KEY", "other-secret-value-42", {"other.test"})});
  Write(guest(), "GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: Basic " +
                     Base64Encode("bob:" + Placeholder("OTHER_KEY")) + "\r\n\r\n");
  std::string reply = ReadUntilEof(guest());
  EXPECT_EQ(reply.rfind("HTTP/1.1 403 Forbidden\r\n", 0), 0u) << reply;
  EXPECT_EQ(ReadUntilEof(upstream()), "");
  InterceptResult r = Join();
  EXPECT_NE(r.refused_reason.find("OTHER_KEY"), std::string::npos);
}

TEST_F(InterceptTest, AForeignPlaceholderAfterAnsweredRequestsIsRefusedAfterTheirResponses) {
  Start({Declare("OTHER_KEY", "other-secret-value-42", {"other.test"})});
  // Pipelined: the refusal must queue behind the first request's response.
  Write(guest(), "GET /1 HTTP/1.1\r\nHost: api.test\r\n\r\nGET /2?k=" + Placeholder("OTHER_KEY") +
                     " HTTP/1.1\r\nHost: api.test\r\n\r\n");
  EXPECT_EQ(ReadHead(upstream()), "GET /1 HTTP/1.1\r\nHost: api.test\r\n\r\n");
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\none");
  std::string reply = ReadUntilEof(guest());
  EXPECT_EQ(reply.rfind("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\noneHTTP/1.1 403 Forbidden", 0),
            0u)
      << reply;
  EXPECT_EQ(ReadUntilEof(upstream()), "");
  InterceptResult r = Join();
  EXPECT_EQ(r.requests, 1);
  EXPECT_EQ(r.refused_status, 403);
}

TEST_F(InterceptTest, HttpRulesPassAnAllowedRequestAndRefuseTheNextWithItsRuleNamed) {
  Start({Declare("API_KEY", kValue, {kHost})}, {},
        {"deny * api.test/repos/me/proj/settings", "allow GET,POST api.test/repos/me/proj"});
  // Pipelined: the allowed request is forwarded (substituted) and answered; the refused one
  // never reaches the upstream, and its 403 queues behind the first response.
  Write(guest(),
        "GET /repos/me/proj/pulls HTTP/1.1\r\nHost: api.test\r\nX-Key: " + Placeholder("API_KEY") +
            "\r\n\r\nGET /repos/ME/Proj/settings HTTP/1.1\r\nHost: api.test\r\n\r\n");
  EXPECT_EQ(ReadHead(upstream()),
            std::string("GET /repos/me/proj/pulls HTTP/1.1\r\nHost: api.test\r\nX-Key: ") + kValue +
                "\r\n\r\n");
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
  std::string reply = ReadUntilEof(guest());
  EXPECT_EQ(reply.rfind("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 403 Forbidden", 0),
            0u)
      << reply;
  EXPECT_NE(reply.find("\r\nX-Trybox-Reason: HTTP rule 'deny * api.test/repos/me/proj/settings' "
                       "refuses GET /repos/ME/Proj/settings\r\n"),
            std::string::npos)
      << reply;
  EXPECT_EQ(ReadUntilEof(upstream()), "");
  InterceptResult r = Join();
  EXPECT_EQ(r.requests, 1);
  EXPECT_EQ(r.refused_status, 403);
  EXPECT_NE(r.refused_reason.find("HTTP rule 'deny"), std::string::npos) << r.refused_reason;
  ExpectNoValue(r, kValue);
}

TEST_F(InterceptTest, HttpRulesRefuseARequestNoRuleAllows) {
  Start({}, {}, {"allow GET api.test/repos/me/proj"});
  Write(guest(), "DELETE /repos/me/proj HTTP/1.1\r\nHost: api.test\r\n\r\n");
  std::string reply = ReadUntilEof(guest());
  EXPECT_EQ(reply.rfind("HTTP/1.1 403 Forbidden\r\n", 0), 0u) << reply;
  EXPECT_NE(reply.find("no HTTP rule for api.test allows DELETE /repos/me/proj"), std::string::npos)
      << reply;
  EXPECT_EQ(ReadUntilEof(upstream()), "");
  EXPECT_EQ(Join().requests, 0);
}

TEST_F(InterceptTest, TwoRequestsOnAKeptAliveConnectionAreBothSubstitutedAndAnsweredInOrder) {
  Start({Declare("API_KEY", kValue, {kHost})});
  std::string ph = Placeholder("API_KEY");
  Write(guest(), "GET /a HTTP/1.1\r\nHost: api.test\r\nX-Api-Key: " + ph + "\r\n\r\n");
  EXPECT_EQ(ReadHead(upstream()),
            std::string("GET /a HTTP/1.1\r\nHost: api.test\r\nX-Api-Key: ") + kValue + "\r\n\r\n");
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst");
  EXPECT_EQ(ReadMessage(guest()), "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst");
  Write(guest(), "GET /b HTTP/1.1\r\nHost: api.test\r\nX-Api-Key: " + ph + "\r\n\r\n");
  EXPECT_EQ(ReadHead(upstream()),
            std::string("GET /b HTTP/1.1\r\nHost: api.test\r\nX-Api-Key: ") + kValue + "\r\n\r\n");
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond");
  EXPECT_EQ(ReadMessage(guest()), "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond");
  InterceptResult r = CloseAndJoin();
  EXPECT_EQ(r.requests, 2);
  EXPECT_EQ(r.substitutions.at("API_KEY"), 2);
  EXPECT_EQ(r.error, "");
}

TEST_F(InterceptTest, PipelinedRequestsGetTheirResponsesInOrder) {
  Start({Declare("API_KEY", kValue, {kHost}, false, false, /*target=*/true)});
  std::string ph = Placeholder("API_KEY");
  Write(guest(), "GET /a?k=" + ph + " HTTP/1.1\r\nHost: api.test\r\n\r\nHEAD /b?k=" + ph +
                     " HTTP/1.1\r\nHost: api.test\r\n\r\n");
  EXPECT_EQ(ReadHead(upstream()),
            std::string("GET /a?k=") + kValue + " HTTP/1.1\r\nHost: api.test\r\n\r\n");
  EXPECT_EQ(ReadHead(upstream()),
            std::string("HEAD /b?k=") + kValue + " HTTP/1.1\r\nHost: api.test\r\n\r\n");
  Write(
      upstream(),
      "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nAHTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n");
  EXPECT_EQ(ReadMessage(guest()), "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nA");
  EXPECT_EQ(ReadHead(guest()), "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n");
  InterceptResult r = CloseAndJoin();
  EXPECT_EQ(r.requests, 2);
  EXPECT_EQ(r.substitutions.at("API_KEY"), 2);
}

TEST_F(InterceptTest, AChunkedRequestBodyIsRelayedIntact) {
  Start({Declare("API_KEY", kValue, {kHost})});
  std::string ph = Placeholder("API_KEY");
  // Without `body`, a placeholder in the body is neither replaced nor a reason to refuse.
  std::string body = "5;ext=\"x\"\r\nhello\r\n" + Hex(ph.size() + 3) + "\r\n" + ph +
                     "...\r\n0\r\nX-Checksum: abc\r\n\r\n";
  std::string head =
      "POST /upload HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n";
  Write(guest(), head + body);
  EXPECT_EQ(ReadN(upstream(), head.size() + body.size()), head + body);
  std::string response =
      "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n";
  Write(upstream(), response);
  EXPECT_EQ(ReadN(guest(), response.size()), response);
  InterceptResult r = CloseAndJoin();
  EXPECT_EQ(r.requests, 1);
  EXPECT_EQ(r.error, "");
}

TEST_F(InterceptTest, ContentLengthWithTransferEncodingIsRefusedWith400) {
  Start({Declare("API_KEY", kValue, {kHost})});
  Write(guest(),
        "POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n"
        "\r\n0\r\n\r\n");
  std::string reply = ReadUntilEof(guest());
  EXPECT_EQ(reply.rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u) << reply;
  EXPECT_NE(reply.find("Transfer-Encoding and Content-Length"), std::string::npos);
  EXPECT_EQ(ReadUntilEof(upstream()), "");
  EXPECT_EQ(Join().refused_status, 400);
}

TEST_F(InterceptTest, ATransferEncodingNotEndingInChunkedIsRefusedWith400) {
  Start({Declare("API_KEY", kValue, {kHost})});
  Write(guest(), "POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked, gzip\r\n\r\n");
  std::string reply = ReadUntilEof(guest());
  EXPECT_EQ(reply.rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u) << reply;
  EXPECT_EQ(ReadUntilEof(upstream()), "");
  EXPECT_EQ(Join().refused_status, 400);
}

TEST_F(InterceptTest, WithBodySubstitutionTheValueGoesInAndContentLengthIsFixed) {
  // A value shorter than a placeholder can be (16): the body's length changes.
  Start({Declare("TOKEN", "short-val", {kHost}, /*body=*/true)});
  std::string body = "{\"token\":\"" + Placeholder("TOKEN") + "\"}";
  Write(guest(),
        "POST /login HTTP/1.1\r\nHost: api.test\r\nContent-Length: " + std::to_string(body.size()) +
            "\r\nContent-Type: application/json\r\n\r\n" + body);
  std::string want = "{\"token\":\"short-val\"}";
  EXPECT_EQ(ReadMessage(upstream()), "POST /login HTTP/1.1\r\nHost: api.test\r\nContent-Length: " +
                                         std::to_string(want.size()) +
                                         "\r\nContent-Type: application/json\r\n\r\n" + want);
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(ReadHead(guest()), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  InterceptResult r = CloseAndJoin();
  EXPECT_EQ(r.substitutions.at("TOKEN"), 1);
  ExpectNoValue(r, "short-val");
}

TEST_F(InterceptTest, WithBodySubstitutionAChunkedBodyIsReframedWithContentLength) {
  Start({Declare("TOKEN", "short-val", {kHost}, /*body=*/true)});
  std::string ph = Placeholder("TOKEN");
  Write(guest(),
        "POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nt=(\r\n" +
            Hex(ph.size()) + "\r\n" + ph + "\r\n1\r\n)\r\n0\r\n\r\n");
  EXPECT_EQ(ReadMessage(upstream()),
            "POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 13\r\n\r\nt=(short-val)");
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(ReadHead(guest()), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(CloseAndJoin().substitutions.at("TOKEN"), 1);
}

TEST_F(InterceptTest, WithBodySubstitutionAMalformedChunkedBodyIsRefusedWith400) {
  Start({Declare("TOKEN", "short-val", {kHost}, /*body=*/true)});
  Write(guest(),
        "POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n"
        "zz\r\nhello\r\n0\r\n\r\n");
  std::string reply = ReadUntilEof(guest());
  EXPECT_EQ(reply.rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u) << reply;
  EXPECT_EQ(ReadUntilEof(upstream()), "");
  EXPECT_EQ(Join().requests, 0);
}

TEST_F(InterceptTest, WithoutBodySubstitutionTheBodyPassesUnchanged) {
  Start({Declare("TOKEN", "short-val", {kHost}, /*body=*/false)});
  std::string body = "{\"token\":\"" + Placeholder("TOKEN") + "\"}";
  std::string request =
      "POST /login HTTP/1.1\r\nHost: api.test\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n" + body;
  Write(guest(), request);
  EXPECT_EQ(ReadMessage(upstream()), request);
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(ReadHead(guest()), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  InterceptResult r = CloseAndJoin();
  EXPECT_EQ(r.requests, 1);
  EXPECT_TRUE(r.substitutions.empty());
}

TEST_F(InterceptTest, WithBodySubstitutionAForeignPlaceholderInTheBodyIsRefused) {
  Start({Declare("TOKEN", "short-val", {kHost}, /*body=*/true),
         Declare("OTHER_KEY", "other-secret-value-42", {"other.test"})});
  std::string body = "x=" + Placeholder("OTHER_KEY");
  Write(guest(), "POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\n\r\n" + body);
  std::string reply = ReadUntilEof(guest());
  EXPECT_EQ(reply.rfind("HTTP/1.1 403 Forbidden\r\n", 0), 0u) << reply;
  EXPECT_NE(reply.find("OTHER_KEY"), std::string::npos);
  EXPECT_EQ(ReadUntilEof(upstream()), "");
  EXPECT_EQ(Join().requests, 0);
}

TEST_F(InterceptTest, WithBodySubstitutionTheRelayAnswers100ContinueItself) {
  Start({Declare("TOKEN", "short-val", {kHost}, /*body=*/true)});
  std::string body = "t=" + Placeholder("TOKEN");
  Write(guest(), "PUT /x HTTP/1.1\r\nHost: api.test\r\nExpect: 100-continue\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\n\r\n");
  // The body is needed before the head can go, so the relay must not wait for the upstream.
  EXPECT_EQ(ReadHead(guest()), "HTTP/1.1 100 Continue\r\n\r\n");
  Write(guest(), body);
  EXPECT_EQ(ReadMessage(upstream()),
            "PUT /x HTTP/1.1\r\nHost: api.test\r\nContent-Length: 11\r\n\r\nt=short-val");
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(ReadHead(guest()), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  CloseAndJoin();
}

TEST_F(InterceptTest, ABodyOverTheBufferCapIsRelayedUnmodified) {
  InterceptLimits limits;
  limits.max_buffered_body = 1024;
  Start({Declare("TOKEN", "short-val", {kHost}, /*body=*/true)}, limits);
  std::string ph = Placeholder("TOKEN");
  std::string chunk(1000, 'a');
  std::string body = "3e8\r\n" + chunk + "\r\n" + Hex(ph.size()) + "\r\n" + ph + "\r\n3e8\r\n" +
                     chunk + "\r\n0\r\n\r\n";
  std::string request = "POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n";
  Write(guest(), request + body);
  EXPECT_EQ(ReadN(upstream(), request.size() + body.size()), request + body);
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(ReadHead(guest()), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  InterceptResult r = CloseAndJoin();
  EXPECT_TRUE(r.substitutions.empty());
}

TEST_F(InterceptTest, SetCookieIsDroppedFromResponses) {
  Start({Declare("API_KEY", kValue, {kHost})});
  Write(guest(), "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n");
  ReadHead(upstream());
  Write(upstream(),
        "HTTP/1.1 200 OK\r\nSet-Cookie: session=abc\r\nX-Other: y\r\nset-cookie2: old=1\r\n"
        "Content-Length: 2\r\n\r\nhi");
  EXPECT_EQ(ReadMessage(guest()), "HTTP/1.1 200 OK\r\nX-Other: y\r\nContent-Length: 2\r\n\r\nhi");
  CloseAndJoin();
}

TEST_F(InterceptTest, SetCookieIsKeptWhenABoundSecretKeepsCookies) {
  Start({Declare("API_KEY", kValue, {kHost}, false, /*keep_cookies=*/true)});
  Write(guest(), "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n");
  ReadHead(upstream());
  std::string response =
      "HTTP/1.1 200 OK\r\nSet-Cookie: session=abc\r\nContent-Length: 2\r\n\r\nhi";
  Write(upstream(), response);
  EXPECT_EQ(ReadMessage(guest()), response);
  CloseAndJoin();
}

TEST_F(InterceptTest, AHeadResponseWithContentLengthHasNoBodyAndTheNextResponseFollows) {
  Start({Declare("API_KEY", kValue, {kHost})});
  Write(guest(), "HEAD /big HTTP/1.1\r\nHost: api.test\r\n\r\n");
  ReadHead(upstream());
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n");
  EXPECT_EQ(ReadHead(guest()), "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n");
  Write(guest(), "GET /small HTTP/1.1\r\nHost: api.test\r\n\r\n");
  EXPECT_EQ(ReadHead(upstream()), "GET /small HTTP/1.1\r\nHost: api.test\r\n\r\n");
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
  EXPECT_EQ(ReadMessage(guest()), "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
  EXPECT_EQ(CloseAndJoin().requests, 2);
}

TEST_F(InterceptTest, A100ContinueReachesTheGuestBeforeTheFinalResponse) {
  Start({Declare("API_KEY", kValue, {kHost})});
  std::string head =
      "PUT /f HTTP/1.1\r\nHost: api.test\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n";
  Write(guest(), head);
  EXPECT_EQ(ReadHead(upstream()), head);
  Write(upstream(), "HTTP/1.1 100 Continue\r\n\r\n");
  EXPECT_EQ(ReadHead(guest()), "HTTP/1.1 100 Continue\r\n\r\n");
  Write(guest(), "12345");
  EXPECT_EQ(ReadN(upstream(), 5), "12345");
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(ReadHead(guest()), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(CloseAndJoin().error, "");
}

TEST_F(InterceptTest, AResponseWithoutLengthRunsUntilTheUpstreamClosesThenTheGuestIsClosed) {
  Start({Declare("API_KEY", kValue, {kHost})});
  Write(guest(), "GET /stream HTTP/1.1\r\nHost: api.test\r\n\r\n");
  ReadHead(upstream());
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\npart one, ");
  Write(upstream(), "part two");
  ::shutdown(upstream(), SHUT_WR);
  EXPECT_EQ(ReadUntilEof(guest()),
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\npart one, part two");
  InterceptResult r = Join();
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.requests, 1);
}

TEST_F(InterceptTest, TheUpstreamClosingBetweenRequestsClosesTheGuest) {
  Start({Declare("API_KEY", kValue, {kHost})});
  Write(guest(), "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n");
  ReadHead(upstream());
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  ::shutdown(upstream(), SHUT_WR);
  EXPECT_EQ(ReadUntilEof(guest()), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(Join().error, "");
}

TEST_F(InterceptTest, AConnectionCloseResponseEndsTheConnectionAfterItsBody) {
  Start({Declare("API_KEY", kValue, {kHost})});
  Write(guest(), "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n");
  ReadHead(upstream());
  Write(upstream(), "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbye");
  EXPECT_EQ(ReadUntilEof(guest()),
            "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbye");
  EXPECT_EQ(Join().error, "");
}

TEST_F(InterceptTest, ARequestWithConnectionCloseEndsTheConnectionAfterItsResponse) {
  Start({Declare("API_KEY", kValue, {kHost})});
  Write(guest(), "GET / HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(ReadHead(upstream()), "GET / HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n");
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
  EXPECT_EQ(ReadUntilEof(guest()), "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
  EXPECT_EQ(ReadUntilEof(upstream()), "");
  InterceptResult r = Join();
  EXPECT_EQ(r.requests, 1);
  EXPECT_EQ(r.error, "");
}

TEST_F(InterceptTest, A101UpgradeTurnsTheConnectionIntoRawBytesBothWays) {
  Start({Declare("API_KEY", kValue, {kHost})});
  std::string request =
      "GET /ws HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
  Write(guest(), request);
  EXPECT_EQ(ReadHead(upstream()), request);
  std::string switching =
      "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
  Write(upstream(), switching + "\x81\x02hi");
  EXPECT_EQ(ReadN(guest(), switching.size() + 4), switching + "\x81\x02hi");
  // Not HTTP any more: not parsed, not rewritten.
  std::string frame = "GET / HTTP/1.1\r\n\r\n\x01\x02 raw";
  Write(guest(), frame);
  EXPECT_EQ(ReadN(upstream(), frame.size()), frame);
  InterceptResult r = CloseAndJoin();
  EXPECT_TRUE(r.upgraded);
  EXPECT_EQ(r.requests, 1);
  EXPECT_EQ(r.error, "");
}

TEST_F(InterceptTest, ADeclinedUpgradeKeepsTheConnectionHttp) {
  Start({Declare("API_KEY", kValue, {kHost}, false, false, /*target=*/true)});
  Write(guest(), "GET /ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\n\r\n");
  ReadHead(upstream());
  Write(upstream(), "HTTP/1.1 426 Upgrade Required\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(ReadHead(guest()), "HTTP/1.1 426 Upgrade Required\r\nContent-Length: 0\r\n\r\n");
  Write(guest(), "GET /k=" + Placeholder("API_KEY") + " HTTP/1.1\r\nHost: api.test\r\n\r\n");
  EXPECT_EQ(ReadHead(upstream()),
            std::string("GET /k=") + kValue + " HTTP/1.1\r\nHost: api.test\r\n\r\n");
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(ReadHead(guest()), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  InterceptResult r = CloseAndJoin();
  EXPECT_FALSE(r.upgraded);
  EXPECT_EQ(r.requests, 2);
}

TEST_F(InterceptTest, AMalformedResponseIsAnErrorAndTheGuestGetsA502NotItsBytes) {
  Start({Declare("API_KEY", kValue, {kHost})});
  Write(guest(), "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n");
  ReadHead(upstream());
  Write(upstream(), std::string("HTTP/1.1 2OO OK\r\nX-Echo: ") + kValue + "\r\n\r\n");
  std::string reply = ReadUntilEof(guest());
  EXPECT_EQ(reply.rfind("HTTP/1.1 502 Bad Gateway\r\n", 0), 0u) << reply;
  EXPECT_EQ(reply.find("2OO"), std::string::npos);
  EXPECT_EQ(reply.find(kValue), std::string::npos);
  InterceptResult r = Join();
  EXPECT_NE(r.error, "");
  EXPECT_EQ(r.refused_status, 502);
  ExpectNoValue(r, kValue);
}

TEST_F(InterceptTest, AResponseBodyCutShortAbortsTheGuest) {
  Start({Declare("API_KEY", kValue, {kHost})});
  Write(guest(), "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n");
  ReadHead(upstream());
  // ".:." cannot begin a secret's value, so the scrubber holds none of it back.
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n.:.");
  ::shutdown(upstream(), SHUT_WR);
  EXPECT_EQ(ReadUntilEof(guest()), "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n.:.");
  InterceptResult r = Join();
  EXPECT_NE(r.error.find("closed in the middle of a body"), std::string::npos) << r.error;
  EXPECT_EQ(r.refused_status, 0);
}

TEST_F(InterceptTest, ATooLargeRequestHeadIsRefusedWith431) {
  InterceptLimits limits;
  limits.max_head = 1024;
  Start({Declare("API_KEY", kValue, {kHost})}, limits);
  Write(guest(),
        "GET / HTTP/1.1\r\nHost: api.test\r\nX-Big: " + std::string(2000, 'x') + "\r\n\r\n");
  std::string reply = ReadUntilEof(guest());
  EXPECT_EQ(reply.rfind("HTTP/1.1 431 Request Header Fields Too Large\r\n", 0), 0u) << reply;
  EXPECT_EQ(ReadUntilEof(upstream()), "");
  EXPECT_EQ(Join().refused_status, 431);
}

TEST_F(InterceptTest, AnIncompleteRequestHeadTimesOutWith408) {
  InterceptLimits limits;
  limits.head_timeout = std::chrono::milliseconds(50);
  Start({Declare("API_KEY", kValue, {kHost})}, limits);
  Write(guest(), "GET / HTTP/1.1\r\nHo");
  std::string reply = ReadUntilEof(guest());
  EXPECT_EQ(reply.rfind("HTTP/1.1 408 Request Timeout\r\n", 0), 0u) << reply;
  EXPECT_EQ(ReadUntilEof(upstream()), "");
  EXPECT_EQ(Join().refused_status, 408);
}

TEST_F(InterceptTest, AnIdleConnectionIsClosedQuietly) {
  InterceptLimits limits;
  limits.head_timeout = std::chrono::milliseconds(50);
  Start({Declare("API_KEY", kValue, {kHost})}, limits);
  EXPECT_EQ(ReadUntilEof(upstream()), "");
  ::shutdown(upstream(), SHUT_WR);
  EXPECT_EQ(ReadUntilEof(guest()), "");
  InterceptResult r = Join();
  EXPECT_EQ(r.refused_status, 0);
  EXPECT_EQ(r.error, "");
}

TEST_F(InterceptTest, AnAbsoluteFormTargetIsRefusedWith400) {
  Start({Declare("API_KEY", kValue, {kHost})});
  Write(guest(), "GET http://api.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n");
  std::string reply = ReadUntilEof(guest());
  EXPECT_EQ(reply.rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u) << reply;
  EXPECT_EQ(ReadUntilEof(upstream()), "");
  EXPECT_EQ(Join().refused_status, 400);
}

TEST_F(InterceptTest, AHostHeaderNamingAnotherHostIsRefusedWith403) {
  // Another site behind the same front end would get the secret (domain fronting).
  Start({Declare("API_KEY", kValue, {kHost})});
  Write(guest(), "GET / HTTP/1.1\r\nHost: attacker.example\r\nAuthorization: Bearer " +
                     Placeholder("API_KEY") + "\r\n\r\n");
  std::string reply = ReadUntilEof(guest());
  EXPECT_EQ(reply.rfind("HTTP/1.1 403 Forbidden\r\n", 0), 0u) << reply;
  EXPECT_EQ(ReadUntilEof(upstream()), "");
  InterceptResult r = Join();
  EXPECT_EQ(r.refused_status, 403);
  EXPECT_EQ(r.requests, 0);
}

TEST_F(InterceptTest, AHostHeaderWithAPortAndOtherCaseIsTheSameHost) {
  Start({Declare("API_KEY", kValue, {kHost})});
  Write(guest(), "GET / HTTP/1.1\r\nHost: API.Test.:443\r\n\r\n");
  EXPECT_EQ(ReadHead(upstream()), "GET / HTTP/1.1\r\nHost: API.Test.:443\r\n\r\n");
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(ReadHead(guest()), "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  CloseAndJoin();
}

TEST_F(InterceptTest, LargeBodiesAreRelayedIntactBothWays) {
  Start({Declare("API_KEY", kValue, {kHost})});
  std::string up(3 << 20, '\0');
  std::string down(3 << 20, '\0');
  for (size_t i = 0; i < up.size(); ++i) {
    up[i] = static_cast<char>(i * 7 + i / 251);
    down[i] = static_cast<char>(i * 13 + i / 241);
  }
  std::string head =
      "PUT /blob HTTP/1.1\r\nHost: api.test\r\nContent-Length: " + std::to_string(up.size()) +
      "\r\n\r\n";
  std::thread guest_writer([&] { EXPECT_TRUE(WriteFull(guest(), head + up).ok()); });
  EXPECT_EQ(ReadN(upstream(), head.size() + up.size()), head + up);
  guest_writer.join();
  // Down as chunks of uneven sizes.
  std::string chunked;
  for (size_t at = 0, n = 1; at < down.size(); at += n, n = n * 3 + 1) {
    n = std::min(n, down.size() - at);
    chunked += Hex(n) + "\r\n" + down.substr(at, n) + "\r\n";
  }
  chunked += "0\r\n\r\n";
  std::string response = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked;
  std::thread upstream_writer([&] { EXPECT_TRUE(WriteFull(upstream(), response).ok()); });
  // The body is scrubbed on its way (nothing to take out here), and chunked anew.
  const std::string head_down = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
  EXPECT_EQ(ReadN(guest(), head_down.size()), head_down);
  std::string got;
  while (got.size() < 5 || got.compare(got.size() - 5, 5, "0\r\n\r\n") != 0 ||
         Dechunk(got).size() < down.size()) {
    std::string b = ReadSomeBytes(guest(), 1 << 20);
    if (b.empty()) break;
    got += b;
  }
  EXPECT_TRUE(Dechunk(got) == down) << "the payload changed on its way down";
  upstream_writer.join();
  InterceptResult r = CloseAndJoin();
  EXPECT_EQ(r.bytes_down, static_cast<int64_t>(head_down.size() + got.size()));
  EXPECT_EQ(r.scrubbed, 0);
  EXPECT_EQ(r.bytes_up, static_cast<int64_t>(head.size() + up.size()));
}

// ---- What comes back (issue 41.2): a host that reflects the request hands back nothing of
// the value. Each response below repeats the value the relay put in; the guest must get the
// placeholder in its place.

constexpr char kReflected[] = "sk-live-R3fl3ct/ed+0123456789abcdef";

class ReflectTest : public InterceptTest {
 protected:
  // One request carrying the placeholder in a header; returns what the upstream got.
  std::string Ask(const std::string& extra = "") {
    Write(guest(), "GET /echo HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " +
                       Placeholder("KEY") + "\r\n" + extra + "\r\n");
    return ReadHead(upstream());
  }
  void StartReflecting() {
    Start({Declare("KEY", kReflected, {kHost}, false, false, /*target=*/true)});
  }
  // Every form of the value a reflecting host could use.
  static std::vector<std::string> Forms() {
    std::string v = kReflected;
    std::string pct, json;
    for (unsigned char c : v) {
      char b[8];
      std::snprintf(b, sizeof b, "%%%02X", c);
      pct += b;
    }
    for (char c : v) json += c == '/' ? std::string("\\/") : std::string(1, c);
    return {v, pct, json, Base64Encode(v), Base64Encode("user:" + v)};
  }
  static void ExpectNoForm(const std::string& got) {
    for (const std::string& f : Forms()) EXPECT_EQ(got.find(f), std::string::npos) << got;
  }
};

TEST_F(ReflectTest, ARedirectRepeatingTheValueInItsLocationGetsThePlaceholder) {
  StartReflecting();
  std::string ph = Placeholder("KEY");
  Write(guest(), "GET /old?token=" + ph + " HTTP/1.1\r\nHost: api.test\r\n\r\n");
  std::string up = ReadHead(upstream());
  ASSERT_NE(up.find(std::string("token=") + "sk-live-R3fl3ct%2Fed%2B0123456789abcdef"),
            std::string::npos)
      << "the value was not put into the query";
  Write(upstream(),
        "HTTP/1.1 301 Moved sk-live-R3fl3ct/ed+0123456789abcdef\r\n"
        "Location: https://api.test/new?token=sk-live-R3fl3ct%2Fed%2B0123456789abcdef\r\n"
        "Content-Length: 0\r\n\r\n");
  std::string got = ReadHead(guest());
  ExpectNoForm(got);
  EXPECT_EQ(got.find("sk-live-R3fl3ct"), std::string::npos) << got;
  EXPECT_NE(got.find("Location: https://api.test/new?token=" + ph + "\r\n"), std::string::npos)
      << got;
  EXPECT_EQ(got.rfind("HTTP/1.1 301 Moved " + ph + "\r\n", 0), 0u) << got;
  InterceptResult r = CloseAndJoin();
  EXPECT_EQ(r.scrubbed, 2);
  ExpectNoValue(r, kReflected);
}

// A 404 page and a JSON error, each with a Content-Length that must stay true.
TEST_F(ReflectTest, BodiesWithALengthKeepItAndLoseEveryFormOfTheValue) {
  StartReflecting();
  std::string ph = Placeholder("KEY");
  Ask();
  std::string body = "<h1>Not Found</h1><p>" + std::string(kReflected) + "</p> and " +
                     Base64Encode("user:" + std::string(kReflected)) +
                     " {\"error\":\"bad token sk-live-R3fl3ct\\/ed\\u002B0123456789abcdef\"}";
  Write(upstream(), "HTTP/1.1 404 Not Found\r\nContent-Length: " + std::to_string(body.size()) +
                        "\r\n\r\n" + body);
  std::string got = ReadMessage(guest());
  ExpectNoForm(got);
  EXPECT_EQ(got.find("R3fl3ct"), std::string::npos) << got;
  EXPECT_NE(got.find("<p>" + ph + "</p>"), std::string::npos) << got;
  EXPECT_NE(got.find(Base64Encode("user:" + ph)), std::string::npos) << got;
  EXPECT_EQ(got.size(), got.find("\r\n\r\n") + 4 + body.size()) << "the length changed";
  InterceptResult r = CloseAndJoin();
  EXPECT_EQ(r.scrubbed, 3);
}

// A chunked body split inside the value, at every byte of it: the guest's payload never holds
// it, and comes out the same wherever the split fell.
TEST_F(ReflectTest, AChunkedBodySplitInsideTheValueAtEveryByteIsScrubbed) {
  StartReflecting();
  std::string ph = Placeholder("KEY");
  const std::string payload = "data: {\"echo\": \"" + std::string(kReflected) + "\"}\n\n";
  for (size_t cut = 0; cut <= payload.size(); ++cut) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    Ask();
    std::string first = payload.substr(0, cut), second = payload.substr(cut);
    std::string chunks;
    if (!first.empty()) chunks += Hex(first.size()) + "\r\n" + first + "\r\n";
    if (!second.empty()) chunks += Hex(second.size()) + "\r\n" + second + "\r\n";
    Write(upstream(), "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks);
    Write(upstream(), "0\r\n\r\n");
    std::string head = ReadHead(guest());
    ASSERT_EQ(head, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    std::string got;
    while (got.size() < 5 || got.compare(got.size() - 5, 5, "0\r\n\r\n") != 0) {
      std::string b = ReadSomeBytes(guest(), 4096);
      if (b.empty()) break;
      got += b;
    }
    ASSERT_EQ(got.find(kReflected), std::string::npos);
    EXPECT_EQ(Dechunk(got), "data: {\"echo\": \"" + ph + "\"}\n\n");
  }
  EXPECT_EQ(CloseAndJoin().scrubbed, static_cast<int>(payload.size() + 1));
}

// A stream is not held whole: what cannot be the start of the value reaches the guest while
// the upstream still sends.
TEST_F(ReflectTest, AStreamedBodyReachesTheGuestAsItComes) {
  StartReflecting();
  Ask();
  Write(upstream(), "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
  EXPECT_EQ(ReadHead(guest()), "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
  const std::string event = Hex(17) + "\r\nevent: one\ndata:\n\r\n";
  Write(upstream(), event);
  EXPECT_EQ(ReadN(guest(), event.size()), event);
  Write(upstream(), "0\r\n\r\n");
  EXPECT_EQ(ReadN(guest(), 5), "0\r\n\r\n");
  CloseAndJoin();
}

std::string Compress(const std::string& text, int bits) {
  z_stream z{};
  EXPECT_EQ(::deflateInit2(&z, 6, Z_DEFLATED, bits, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(::deflateBound(&z, text.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(::deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(out.size() - z.avail_out);
  ::deflateEnd(&z);
  return out;
}

// gzip, zlib-wrapped and raw deflate bodies are decoded, scrubbed and sent decoded, chunked,
// with the coding and the length gone.
TEST_F(ReflectTest, ACompressedBodyIsDecodedScrubbedAndSentDecoded) {
  StartReflecting();
  std::string ph = Placeholder("KEY");
  const std::string text = std::string(5000, 'x') + "{\"token\": \"" + kReflected + "\"}";
  for (auto [coding, bits] : std::vector<std::pair<std::string, int>>{
           {"gzip", 15 + 16}, {"deflate", 15}, {"deflate", -15}}) {
    SCOPED_TRACE(coding + " " + std::to_string(bits));
    std::string up = Ask("Accept-Encoding: br, gzip;q=0.8, zstd, deflate\r\n");
    EXPECT_NE(up.find("Accept-Encoding: gzip;q=0.8, deflate\r\n"), std::string::npos)
        << "only codings the relay can read are asked for: " << up;
    std::string z = Compress(text, bits);
    ASSERT_EQ(z.find(kReflected), std::string::npos);
    Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Encoding: " + coding + "\r\nContent-Length: " +
                          std::to_string(z.size()) + "\r\nX-A: b\r\n\r\n" + z);
    std::string head = ReadHead(guest());
    EXPECT_EQ(head, "HTTP/1.1 200 OK\r\nX-A: b\r\nTransfer-Encoding: chunked\r\n\r\n");
    std::string got;
    while (got.size() < 5 || got.compare(got.size() - 5, 5, "0\r\n\r\n") != 0) {
      std::string b = ReadSomeBytes(guest(), 65536);
      if (b.empty()) break;
      got += b;
    }
    EXPECT_EQ(Dechunk(got), std::string(5000, 'x') + "{\"token\": \"" + ph + "\"}");
  }
  EXPECT_EQ(CloseAndJoin().scrubbed, 3);
}

// A body the relay cannot read is not passed on unread: a 502 naming why, and the audit's
// refusal.
TEST_F(ReflectTest, ABodyInACodingTheRelayCannotReadIsRefusedWith502) {
  for (const std::string coding : {"br", "zstd", "gzip, gzip", "x-unknown"}) {
    SCOPED_TRACE(coding);
    StartReflecting();
    Ask();
    Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Encoding: " + coding +
                          "\r\nContent-Length: 4\r\n\r\n\x01\x02\x03\x04");
    std::string got = ReadUntilEof(guest());
    EXPECT_EQ(got.rfind("HTTP/1.1 502 ", 0), 0u) << got;
    EXPECT_NE(got.find("cannot read to take secret values out"), std::string::npos) << got;
    EXPECT_EQ(got.find("\x01\x02\x03\x04"), std::string::npos);
    InterceptResult r = Join();
    EXPECT_EQ(r.refused_status, 502);
    EXPECT_NE(r.refused_reason.find("cannot read"), std::string::npos) << r.refused_reason;
    TearDown();
  }
}

// A body cut short in the middle of the value: the part that came is held back, never
// released (it is a piece of the value), and the guest sees the body break off.
TEST_F(ReflectTest, ABodyCutShortInsideTheValueReleasesNoneOfIt) {
  StartReflecting();
  Ask();
  const std::string half = std::string(kReflected).substr(0, 20);
  Write(upstream(), "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n.:." + half);
  ::shutdown(upstream(), SHUT_WR);
  std::string got = ReadUntilEof(guest());
  EXPECT_EQ(got, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n.:.");
  InterceptResult r = Join();
  EXPECT_NE(r.error.find("closed in the middle of a body"), std::string::npos) << r.error;
}

TEST_F(ReflectTest, TraceIsRefusedWith405AndNeverReachesTheUpstream) {
  StartReflecting();
  Write(guest(), "TRACE / HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " +
                     Placeholder("KEY") + "\r\n\r\n");
  std::string got = ReadUntilEof(guest());
  EXPECT_EQ(got.rfind("HTTP/1.1 405 ", 0), 0u) << got;
  EXPECT_NE(got.find("TRACE is refused"), std::string::npos) << got;
  ::shutdown(upstream(), SHUT_WR);
  EXPECT_EQ(ReadUntilEof(upstream()), "");
  InterceptResult r = Join();
  EXPECT_EQ(r.requests, 0);
  EXPECT_EQ(r.refused_status, 405);
}

// Without `target`, a placeholder in the path or query goes as it is: only headers get the
// value.
TEST_F(InterceptTest, ASecretWithoutTargetIsNotPutIntoTheRequestTarget) {
  Start({Declare("KEY", kValue, {kHost})});
  std::string ph = Placeholder("KEY");
  Write(guest(), "GET /q?key=" + ph + " HTTP/1.1\r\nHost: api.test\r\nX-Key: " + ph + "\r\n\r\n");
  EXPECT_EQ(ReadHead(upstream()),
            "GET /q?key=" + ph + " HTTP/1.1\r\nHost: api.test\r\nX-Key: " + kValue + "\r\n\r\n");
  Write(upstream(), "HTTP/1.1 204 No Content\r\n\r\n");
  EXPECT_EQ(ReadHead(guest()), "HTTP/1.1 204 No Content\r\n\r\n");
  CloseAndJoin();
}

TEST(ParseResponseHeadTest, AcceptsStatusLinesAndHeadersAsSent) {
  std::string text = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A:b \r\n\r\nok";
  auto r = ParseResponseHead(text);
  ASSERT_TRUE(r.ok() && r->has_value());
  const ResponseHead& h = **r;
  EXPECT_EQ(h.version, "HTTP/1.1");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.reason, "OK");
  ASSERT_EQ(h.headers.size(), 2u);
  EXPECT_EQ(h.headers[1], (std::pair<std::string, std::string>{"X-A", "b"}));
  EXPECT_EQ(h.size, text.size() - 2);
  auto bare = ParseResponseHead("HTTP/1.0 204\r\n\r\n");
  ASSERT_TRUE(bare.ok() && bare->has_value());
  EXPECT_EQ((*bare)->status, 204);
  EXPECT_EQ((*bare)->reason, "");
}

TEST(ParseResponseHeadTest, IncompleteIsNotYetAndTooLargeIsExhausted) {
  auto partial = ParseResponseHead("HTTP/1.1 200 OK\r\nContent-");
  ASSERT_TRUE(partial.ok());
  EXPECT_FALSE(partial->has_value());
  EXPECT_EQ(ParseResponseHead(std::string(100, 'x'), 64).status().code(), Code::kResourceExhausted);
}

TEST(ParseResponseHeadTest, RefusesWhatIsNotStrictHttp1) {
  for (const char* bad :
       {"HTTP/2 200 OK\r\n\r\n", "HTTP/1.1 20 OK\r\n\r\n", "HTTP/1.1 2000 OK\r\n\r\n",
        "HTTP/1.1 099 X\r\n\r\n", "HTTP/1.1 200 OK\nX: y\r\n\r\n",
        "HTTP/1.1 200 OK\r\n folded\r\n\r\n", "HTTP/1.1 200 OK\r\nBad Name: y\r\n\r\n",
        "HTTP/1.1 200 OK\r\nX: a\x01z\r\n\r\n", "http/1.1 200 OK\r\n\r\n"}) {
    auto r = ParseResponseHead(bad);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace trybox::egress
