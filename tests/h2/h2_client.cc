#include "tests/h2/h2_client.h"

#include <algorithm>
#include <cstring>

namespace trybox::h2test {

std::string H2Response::Header(const std::string& name) const {
  for (const auto& [n, v] : headers) {
    if (n == name) return v;
  }
  return "";
}

H2Client::H2Client(egress::ByteStream& stream, std::chrono::milliseconds timeout)
    : stream_(stream), timeout_(timeout) {
  nghttp2_session_callbacks* cb;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_on_header_callback(cb, &H2Client::OnHeader);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, &H2Client::OnData);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, &H2Client::OnClose);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cb, &H2Client::OnFrame);
  nghttp2_session_client_new(&session_, cb, this);
  nghttp2_session_callbacks_del(cb);
  // A window as large as the relay's, so that large bodies are not paced by the client.
  const nghttp2_settings_entry settings[] = {{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20}};
  nghttp2_submit_settings(session_, NGHTTP2_FLAG_NONE, settings, 1);
  nghttp2_session_set_local_window_size(session_, NGHTTP2_FLAG_NONE, 0, 4 << 20);
}

H2Client::~H2Client() { nghttp2_session_del(session_); }

Result<int32_t> H2Client::Submit(const std::string& method, const std::string& path, Fields fields,
                                 std::optional<std::string> body, const std::string& authority,
                                 const std::string& scheme) {
  Fields all = {
      {":method", method}, {":scheme", scheme}, {":authority", authority}, {":path", path}};
  all.insert(all.end(), fields.begin(), fields.end());
  std::vector<nghttp2_nv> nva;
  for (auto& [n, v] : all) {
    nva.push_back({reinterpret_cast<uint8_t*>(n.data()), reinterpret_cast<uint8_t*>(v.data()),
                   n.size(), v.size(), NGHTTP2_NV_FLAG_NONE});
  }
  nghttp2_data_provider provider;
  provider.read_callback = &H2Client::ReadBody;
  int32_t id = nghttp2_submit_request(session_, nullptr, nva.data(), nva.size(),
                                      body ? &provider : nullptr, nullptr);
  if (id < 0) return Internal(std::string("nghttp2_submit_request: ") + nghttp2_strerror(id));
  if (body) bodies_[id] = std::move(*body);
  responses_[id];
  RETURN_IF_ERROR(Flush());
  return id;
}

Status H2Client::Reset(int32_t id) {
  nghttp2_submit_rst_stream(session_, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
  return Flush();
}

Result<H2Response> H2Client::Wait(int32_t id) {
  while (!responses_[id].closed) {
    ASSIGN_OR_RETURN(bool more, PumpOnce());
    if (!more) return Unavailable("the connection ended before stream " + std::to_string(id));
  }
  return responses_[id];
}

Status H2Client::WaitForBody(int32_t id, size_t n) {
  while (responses_[id].body.size() < n && !responses_[id].closed) {
    ASSIGN_OR_RETURN(bool more, PumpOnce());
    if (!more) return Unavailable("the connection ended");
  }
  return Status();
}

Result<bool> H2Client::PumpOnce() {
  RETURN_IF_ERROR(Flush());
  ASSIGN_OR_RETURN(std::string got,
                   stream_.Read(256 * 1024, std::chrono::steady_clock::now() + timeout_));
  if (got.empty()) return false;
  ssize_t rv =
      nghttp2_session_mem_recv(session_, reinterpret_cast<const uint8_t*>(got.data()), got.size());
  if (rv < 0) return Internal(std::string("nghttp2: ") + nghttp2_strerror(static_cast<int>(rv)));
  RETURN_IF_ERROR(Flush());
  return true;
}

Status H2Client::SendRaw(std::string_view b) { return stream_.Write(b); }

Status H2Client::Flush() {
  std::string out;
  for (;;) {
    const uint8_t* data;
    ssize_t n = nghttp2_session_mem_send(session_, &data);
    if (n < 0) return Internal(std::string("nghttp2: ") + nghttp2_strerror(static_cast<int>(n)));
    if (n == 0) break;
    out.append(reinterpret_cast<const char*>(data), static_cast<size_t>(n));
  }
  if (out.empty()) return Status();
  return stream_.Write(out);
}

int H2Client::OnHeader(nghttp2_session*, const nghttp2_frame* frame, const uint8_t* name,
                       size_t namelen, const uint8_t* value, size_t valuelen, uint8_t, void* u) {
  auto& r = Of(u).responses_[frame->hd.stream_id];
  std::string n(reinterpret_cast<const char*>(name), namelen);
  std::string v(reinterpret_cast<const char*>(value), valuelen);
  if (n == ":status") {
    int status = std::atoi(v.c_str());
    if (status < 200) {
      r.interim.push_back(status);
    } else {
      r.status = status;
    }
  } else if (r.status != 0) {
    r.headers.emplace_back(std::move(n), std::move(v));
  }
  return 0;
}

int H2Client::OnData(nghttp2_session*, uint8_t, int32_t id, const uint8_t* data, size_t len,
                     void* u) {
  Of(u).responses_[id].body.append(reinterpret_cast<const char*>(data), len);
  return 0;
}

int H2Client::OnClose(nghttp2_session*, int32_t id, uint32_t error_code, void* u) {
  auto& r = Of(u).responses_[id];
  r.closed = true;
  r.error_code = error_code;
  return 0;
}

int H2Client::OnFrame(nghttp2_session*, const nghttp2_frame* frame, void* u) {
  if (frame->hd.type == NGHTTP2_GOAWAY) Of(u).goaway_ = true;
  return 0;
}

ssize_t H2Client::ReadBody(nghttp2_session*, int32_t id, uint8_t* buf, size_t length,
                           uint32_t* flags, nghttp2_data_source*, void* u) {
  std::string& b = Of(u).bodies_[id];
  size_t n = std::min(length, b.size());
  std::memcpy(buf, b.data(), n);
  b.erase(0, n);
  if (b.empty()) *flags |= NGHTTP2_DATA_FLAG_EOF;
  return static_cast<ssize_t>(n);
}

}  // namespace trybox::h2test
