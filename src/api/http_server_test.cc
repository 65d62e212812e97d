#include "api/http_server.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "api/router.h"
#include "util/tcp.h"

namespace trybox::api {
namespace {

TEST(ListenAddressTest, LoopbackOnly) {
  auto a = ParseListenAddress("127.0.0.1:8080");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8080);
  EXPECT_EQ(ParseListenAddress("localhost:0")->host, "127.0.0.1");
  EXPECT_EQ(ParseListenAddress("[::1]:9")->host, "::1");
  EXPECT_TRUE(ParseListenAddress("127.3.2.1:1").ok());
  for (const char* bad : {"0.0.0.0:80", "10.0.0.1:80", "[::]:80", "192.0.2.1:1"}) {
    auto r = ParseListenAddress(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("loopback"), std::string::npos) << r.status().message();
  }
  for (const char* bad :
       {"127.0.0.1", "127.0.0.1:65536", "127.0.0.1:-1", "example.org:80", "127.0.0.1:8x"}) {
    EXPECT_FALSE(ParseListenAddress(bad).ok()) << bad;
  }
}

// What a raw client gets back: the whole response (the server closes after it).
std::string Exchange(uint16_t port, const std::string& bytes, bool half_close = true) {
  auto fd = ConnectTcpLoopback(port);
  if (!fd.ok()) return "connect failed";
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd->get(), bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  if (half_close) ::shutdown(fd->get(), SHUT_WR);
  std::string out;
  char buf[4096];
  while (true) {
    ssize_t n = ::recv(fd->get(), buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpLimits limits;
    limits.max_body_bytes = 1024;
    auto s = HttpServer::Start({"127.0.0.1", 0}, limits, [this](const HttpRequest& r) {
      ++calls_;
      last_ = r;
      HttpResponse resp{201, "text/plain", {{"X-Seen", r.Header("x-thing")}}, ""};
      resp.body = r.method + " " + r.path + " q=" + (r.query.count("a") ? r.query.at("a") : "") +
                  " body=" + r.body;
      return resp;
    });
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(*s);
  }
  std::unique_ptr<HttpServer> server_;
  std::atomic<int> calls_{0};
  HttpRequest last_;
};

TEST_F(HttpServerTest, ServesAWholeRequest) {
  EXPECT_NE(server_->port(), 0);
  EXPECT_EQ(server_->url(), "http://127.0.0.1:" + std::to_string(server_->port()));
  std::string body = "hello";
  std::string resp = Exchange(server_->port(),
                              "POST /x/y?a=b%20c&a=second HTTP/1.1\r\nHost: h\r\nX-Thing: T1\r\n"
                              "Content-Length: 5\r\nConnection: close\r\n\r\n" +
                                  body);
  EXPECT_EQ(resp.rfind("HTTP/1.1 201", 0), 0u) << resp;
  EXPECT_NE(resp.find("POST /x/y q=b c body=hello"), std::string::npos) << resp;
  EXPECT_NE(resp.find("X-Seen: T1"), std::string::npos) << resp;
  EXPECT_EQ(last_.Header("host"), "h");
  EXPECT_EQ(last_.peer.rfind("127.0.0.1:", 0), 0u) << last_.peer;
  EXPECT_EQ(calls_, 1);
}

TEST_F(HttpServerTest, DeclaredBodyOverTheLimitIs413AndNeverHandled) {
  std::string resp = Exchange(server_->port(),
                              "POST /big HTTP/1.1\r\nHost: h\r\nContent-Length: 100000000\r\n\r\n"
                              "only the start of it");
  EXPECT_EQ(resp.rfind("HTTP/1.1 413", 0), 0u) << resp;
  EXPECT_NE(resp.find("\"code\":413"), std::string::npos) << resp;
  EXPECT_EQ(calls_, 0);
}

TEST_F(HttpServerTest, ChunkedBodyGrowingPastTheLimitClosesWithoutHandling) {
  std::string chunk(800, 'x');
  char size[16];
  std::snprintf(size, sizeof(size), "%zx\r\n", chunk.size());
  std::string req = "POST /big HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 3; ++i) req += size + chunk + "\r\n";
  req += "0\r\n\r\n";
  std::string resp = Exchange(server_->port(), req);
  EXPECT_EQ(resp.find("HTTP/1.1 2"), std::string::npos) << resp;
  EXPECT_EQ(calls_, 0);
}

TEST_F(HttpServerTest, RequestCutInHalfIsNeverHandled) {
  std::string resp =
      Exchange(server_->port(), "POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc");
  EXPECT_EQ(resp.find("HTTP/1.1 2"), std::string::npos) << resp;
  resp = Exchange(server_->port(), "GET /x HTTP/1.1\r\nHos");
  EXPECT_EQ(resp.find("HTTP/1.1 2"), std::string::npos) << resp;
  EXPECT_EQ(calls_, 0);
}

TEST_F(HttpServerTest, GarbageIsRefusedByTheParser) {
  std::string resp = Exchange(server_->port(), "NOT A REQUEST AT ALL\r\n\r\n");
  EXPECT_EQ(resp.find("HTTP/1.1 2"), std::string::npos) << resp;
  EXPECT_EQ(calls_, 0);
}

TEST_F(HttpServerTest, MultipartFormIsParsedIntoFiles) {
  const std::string body =
      "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a/b.txt\"\r\n"
      "Content-Type: application/octet-stream\r\n\r\nline one\r\nline two\r\n"
      "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"c.bin\"\r\n\r\n"
      "\x01\x02\r\n"
      "--XyZ\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhello\r\n--XyZ--\r\n";
  std::string resp = Exchange(server_->port(),
                              "POST /files HTTP/1.1\r\nHost: h\r\nConnection: close\r\n"
                              "Content-Type: multipart/form-data; boundary=XyZ\r\n"
                              "Content-Length: " +
                                  std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(resp.rfind("HTTP/1.1 201", 0), 0u) << resp;
  ASSERT_EQ(last_.files.size(), 2u);
  EXPECT_EQ(last_.files[0].field, "file");
  EXPECT_EQ(last_.files[0].filename, "a/b.txt");
  EXPECT_EQ(last_.files[0].data, "line one\r\nline two");
  EXPECT_EQ(last_.files[1].filename, "c.bin");
  EXPECT_EQ(last_.files[1].data, "\x01\x02");
  EXPECT_EQ(last_.form["note"], "hello");
  EXPECT_TRUE(last_.body.empty());
}

// As undici (node's fetch) sends a form: chunked, each part's head, its data and the CRLF
// before the next boundary in chunks of their own.
TEST_F(HttpServerTest, MultipartPartArrivingInPiecesIsOnePart) {
  const std::vector<std::string> pieces = {
      "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n"
      "Content-Type: application/octet-stream\r\n\r\n",
      "abc", "\r\n", "--XyZ--\r\n"};
  auto fd = ConnectTcpLoopback(server_->port());
  ASSERT_TRUE(fd.ok());
  std::string wire =
      "POST /files HTTP/1.1\r\nHost: h\r\nConnection: close\r\n"
      "Content-Type: multipart/form-data; boundary=XyZ\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  ASSERT_EQ(::send(fd->get(), wire.data(), wire.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(wire.size()));
  for (std::string piece : pieces) {
    char size[16];
    std::snprintf(size, sizeof(size), "%zx\r\n", piece.size());
    piece = size + piece + "\r\n";
    ASSERT_EQ(::send(fd->get(), piece.data(), piece.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(piece.size()));
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  ASSERT_EQ(::send(fd->get(), "0\r\n\r\n", 5, MSG_NOSIGNAL), 5);
  char buf[4096];
  while (::recv(fd->get(), buf, sizeof(buf), 0) > 0) {
  }
  ASSERT_EQ(last_.files.size(), 1u);
  EXPECT_EQ(last_.files[0].data, "abc");
}

TEST_F(HttpServerTest, MultipartCutBeforeItsEndIsRefused) {
  const std::string body =
      "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\n"
      "no closing boundary";
  std::string resp = Exchange(server_->port(),
                              "POST /files HTTP/1.1\r\nHost: h\r\nConnection: close\r\n"
                              "Content-Type: multipart/form-data; boundary=XyZ\r\n"
                              "Content-Length: " +
                                  std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(resp.rfind("HTTP/1.1 400", 0), 0u) << resp;
  EXPECT_EQ(calls_, 0);
}

TEST_F(HttpServerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  std::string two =
      "GET /one HTTP/1.1\r\nHost: h\r\n\r\nGET /two HTTP/1.1\r\nHost: h\r\n"
      "Connection: close\r\n\r\n";
  std::string resp = Exchange(server_->port(), two, /*half_close=*/false);
  EXPECT_NE(resp.find("GET /one"), std::string::npos) << resp;
  EXPECT_NE(resp.find("GET /two"), std::string::npos) << resp;
  EXPECT_EQ(calls_, 2);
}

TEST(HttpServerStreamTest, AStreamedBodyArrivesChunkedAndStopsWhenThePeerGoes) {
  auto ended = std::make_shared<std::atomic<bool>>(false);
  struct Flag {
    std::shared_ptr<std::atomic<bool>> f;
    ~Flag() { *f = true; }
  };
  auto s = HttpServer::Start({"127.0.0.1", 0}, {}, [ended](const HttpRequest& r) {
    HttpResponse resp;
    resp.content_type = "text/plain";
    auto flag = std::make_shared<Flag>(Flag{ended});
    auto n = std::make_shared<int>(0);
    const bool forever = r.path == "/forever";
    resp.stream = [flag, n, forever](std::string* next) {
      if (!forever && *n == 3) return false;
      if (forever) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      *next = "piece" + std::to_string((*n)++) + ";";
      return true;
    };
    return resp;
  });
  ASSERT_TRUE(s.ok());
  std::string resp =
      Exchange((*s)->port(), "GET /three HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
  EXPECT_NE(resp.find("Transfer-Encoding: chunked"), std::string::npos) << resp;
  EXPECT_NE(resp.find("piece0;"), std::string::npos) << resp;
  EXPECT_NE(resp.find("piece2;"), std::string::npos) << resp;
  EXPECT_EQ(resp.find("piece3;"), std::string::npos) << resp;
  for (int i = 0; i < 1000 && !*ended; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(*ended) << "the stream was not destroyed after its end";

  // An endless stream whose reader leaves: the stream is destroyed, not called forever.
  *ended = false;
  {
    auto fd = ConnectTcpLoopback((*s)->port());
    ASSERT_TRUE(fd.ok());
    const std::string req = "GET /forever HTTP/1.1\r\nHost: h\r\n\r\n";
    ASSERT_EQ(::send(fd->get(), req.data(), req.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(req.size()));
    char buf[256];
    ASSERT_GT(::recv(fd->get(), buf, sizeof(buf), 0), 0);
  }
  for (int i = 0; i < 3000 && !*ended; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(*ended) << "an endless stream outlived its reader by 30 s";
}

TEST(HttpServerStartTest, TakenPortIsUnavailable) {
  auto a =
      HttpServer::Start({"127.0.0.1", 0}, {}, [](const HttpRequest&) { return HttpResponse{}; });
  ASSERT_TRUE(a.ok());
  auto b = HttpServer::Start({"127.0.0.1", (*a)->port()}, {},
                             [](const HttpRequest&) { return HttpResponse{}; });
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kUnavailable);
}

TEST(RouterTest, MatchesParamsAndSays404Or405) {
  Router r;
  r.Add("GET", "/sandboxes/{id}", [](const HttpRequest&, const PathParams& p) {
    return HttpResponse{200, "text/plain", {}, "got " + p.at("id")};
  });
  r.Add("DELETE", "/sandboxes/{id}", [](const HttpRequest&, const PathParams&) {
    return HttpResponse{204, "", {}, ""};
  });
  HttpRequest q;
  q.method = "GET";
  q.path = "/sandboxes/abc/";
  EXPECT_EQ(r.Dispatch(q).body, "got abc");
  q.method = "PUT";
  HttpResponse not_allowed = r.Dispatch(q);
  EXPECT_EQ(not_allowed.status, 405);
  ASSERT_EQ(not_allowed.headers.size(), 1u);
  EXPECT_EQ(not_allowed.headers[0].second, "GET, DELETE");
  q.path = "/sandboxes";
  EXPECT_EQ(r.Dispatch(q).status, 404);
  q.method = "GET";
  q.path = "/sandboxes/abc/extra";
  EXPECT_EQ(r.Dispatch(q).status, 404);
}

}  // namespace
}  // namespace trybox::api
