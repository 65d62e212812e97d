#include "channel/frame.h"

#include <cstring>

namespace trybox::channel {
namespace {

uint32_t LoadU32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint32_t>(u[0]) | static_cast<uint32_t>(u[1]) << 8 |
         static_cast<uint32_t>(u[2]) << 16 | static_cast<uint32_t>(u[3]) << 24;
}

void StoreU32(uint32_t v, char* p) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

}  // namespace

const char* FrameTypeName(FrameType t) {
  switch (t) {
    case FrameType::kOpen:
      return "OPEN";
    case FrameType::kData:
      return "DATA";
    case FrameType::kEof:
      return "EOF";
    case FrameType::kEvent:
      return "EVENT";
    case FrameType::kCredit:
      return "CREDIT";
    case FrameType::kEnd:
      return "END";
    case FrameType::kReset:
      return "RESET";
  }
  return "?";
}

void EncodeHeader(uint32_t stream, FrameType type, uint8_t channel, uint32_t payload_len,
                  char out[kHeaderSize]) {
  StoreU32(payload_len, out);
  StoreU32(stream, out + 4);
  out[8] = static_cast<char>(type);
  out[9] = static_cast<char>(channel);
  out[10] = 0;
  out[11] = 0;
}

std::string EncodeFrame(const Frame& f) {
  std::string out(kHeaderSize, '\0');
  EncodeHeader(f.stream, f.type, f.channel, static_cast<uint32_t>(f.payload.size()), out.data());
  out += f.payload;
  return out;
}

Status ValidateHeader(uint32_t len, uint8_t type, uint8_t channel, uint16_t reserved) {
  if (reserved != 0) return InvalidArgument("bad frame: reserved bytes are not zero");
  if (len > kMaxPayload) {
    return InvalidArgument("bad frame: length " + std::to_string(len) + " exceeds the limit of " +
                           std::to_string(kMaxPayload));
  }
  if (type < 1 || type > 7) {
    return InvalidArgument("bad frame: unknown type " + std::to_string(type));
  }
  auto t = static_cast<FrameType>(type);
  bool data_like = t == FrameType::kData || t == FrameType::kEof;
  if (data_like && channel > kMaxChannel) {
    return InvalidArgument("bad frame: unknown channel " + std::to_string(channel));
  }
  if (!data_like && channel != 0) {
    return InvalidArgument(std::string("bad frame: ") + FrameTypeName(t) + " with channel " +
                           std::to_string(channel));
  }
  if (t == FrameType::kEof && len != 0) return InvalidArgument("bad frame: EOF with payload");
  if (t == FrameType::kCredit && len != 4) {
    return InvalidArgument("bad frame: CREDIT payload must be 4 bytes, got " + std::to_string(len));
  }
  return Status::Ok();
}

void FrameDecoder::Feed(std::string_view bytes) {
  // Compact lazily so a long-lived decoder does not grow without bound.
  if (pos_ > 0 && pos_ >= buf_.size() / 2) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  buf_.append(bytes.data(), bytes.size());
}

Result<Frame> FrameDecoder::Next() {
  if (!failed_.ok()) return failed_;
  size_t avail = buf_.size() - pos_;
  if (avail < kHeaderSize) return Unavailable("need more");
  const char* h = buf_.data() + pos_;
  uint32_t len = LoadU32(h);
  uint8_t type = static_cast<uint8_t>(h[8]);
  uint8_t channel = static_cast<uint8_t>(h[9]);
  uint16_t reserved = static_cast<uint16_t>(static_cast<unsigned char>(h[10]) |
                                            static_cast<unsigned char>(h[11]) << 8);
  Status st = ValidateHeader(len, type, channel, reserved);
  if (!st.ok()) {
    failed_ = st;
    return st;
  }
  if (avail < kHeaderSize + len) return Unavailable("need more");
  Frame f;
  f.stream = LoadU32(h + 4);
  f.type = static_cast<FrameType>(type);
  f.channel = channel;
  f.payload.assign(h + kHeaderSize, len);
  pos_ += kHeaderSize + len;
  if (pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  }
  return f;
}

std::string FrameDecoder::DescribePartial() const {
  size_t avail = buf_.size() - pos_;
  if (avail < kHeaderSize) {
    return "got " + std::to_string(avail) + " of " + std::to_string(kHeaderSize) + " header bytes";
  }
  uint32_t len = LoadU32(buf_.data() + pos_);
  return "got " + std::to_string(avail) + " of " + std::to_string(kHeaderSize + len) +
         " frame bytes";
}

}  // namespace trybox::channel
