// The frame: the unit of every trybox wire (guest channel and daemon socket).
// Byte layout and rules: docs/protocol/channel.md.
//
//   0      4        8     9        10       12
//   +------+--------+-----+--------+--------+----------------+
//   | len  | stream | type| channel| reserved| payload (len)  |
//   +------+--------+-----+--------+--------+----------------+
//   little-endian u32, u32, u8, u8, u16 (must be 0)
//
// FrameDecoder is a pure incremental parser of untrusted bytes (fuzzed in fuzz/).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace trybox::channel {

inline constexpr size_t kHeaderSize = 12;
// Largest payload a frame may carry; a header announcing more is a protocol error.
inline constexpr uint32_t kMaxPayload = 1u << 20;
// Largest DATA payload a sender produces (smaller frames keep streams interleaved fairly).
inline constexpr uint32_t kMaxDataChunk = 256u * 1024;

enum class FrameType : uint8_t {
  kOpen = 1,    // JSON request; opens `stream`
  kData = 2,    // raw bytes on `channel`
  kEof = 3,     // no more DATA on `channel` from this sender; empty payload
  kEvent = 4,   // JSON; progress or a non-final message
  kCredit = 5,  // u32 LE: more bytes the receiver will accept on `stream`
  kEnd = 6,     // JSON final result; the stream is finished
  kReset = 7,   // JSON {"reason": ...}; the stream is aborted
};

// Channel numbers for DATA/EOF frames.
inline constexpr uint8_t kChanIn = 0;   // requester -> responder (stdin, file contents)
inline constexpr uint8_t kChanOut = 1;  // responder -> requester (stdout, file contents)
inline constexpr uint8_t kChanErr = 2;  // responder -> requester (stderr)
inline constexpr uint8_t kMaxChannel = 2;

const char* FrameTypeName(FrameType t);

struct Frame {
  uint32_t stream = 0;
  FrameType type = FrameType::kData;
  uint8_t channel = 0;
  std::string payload;
};

// Appends the encoded header for a frame with `payload_len` bytes of payload.
void EncodeHeader(uint32_t stream, FrameType type, uint8_t channel, uint32_t payload_len,
                  char out[kHeaderSize]);
std::string EncodeFrame(const Frame& f);

// Incremental decoder. Feed bytes as they arrive, then pull frames with Next(). After an
// error the decoder stays failed: the connection must be dropped, since framing is lost.
class FrameDecoder {
 public:
  void Feed(std::string_view bytes);
  // kOk with a frame, kUnavailable("need more") when no complete frame is buffered yet,
  // kInvalidArgument for a malformed frame.
  Result<Frame> Next();
  // True if a partial frame is buffered (used to name "a frame cut in half" at EOF).
  bool HasPartial() const { return buf_.size() > pos_; }
  size_t buffered() const { return buf_.size() - pos_; }
  // Describes the partial frame: "got 7 of 12 header bytes" / "got 10 of 4108 frame bytes".
  std::string DescribePartial() const;

 private:
  std::string buf_;
  size_t pos_ = 0;
  Status failed_;
};

// Validates a header (type known, reserved zero, length bound, per-type rules).
Status ValidateHeader(uint32_t len, uint8_t type, uint8_t channel, uint16_t reserved);

}  // namespace trybox::channel
