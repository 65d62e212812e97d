// libFuzzer target for the frame decoder: arbitrary bytes, fed in arbitrary splits, must
// never crash, and every frame it yields must satisfy the header rules and re-encode to
// the same bytes. Build with -DTRYBOX_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "channel/frame.h"

using trybox::channel::EncodeFrame;
using trybox::channel::FrameDecoder;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // The first byte picks the split size, so partial frames are exercised too.
  size_t step = static_cast<size_t>(data[0] % 17) + 1;
  std::string in(reinterpret_cast<const char*>(data + 1), size - 1);
  FrameDecoder dec;
  std::string reencoded;
  size_t consumed = 0;
  for (size_t off = 0; off < in.size(); off += step) {
    dec.Feed(std::string_view(in).substr(off, step));
    for (;;) {
      auto f = dec.Next();
      if (!f.ok()) {
        if (f.status().code() != trybox::Code::kUnavailable) return 0;  // rejected: done
        break;
      }
      if (f->payload.size() > trybox::channel::kMaxPayload) std::abort();
      std::string e = EncodeFrame(*f);
      reencoded += e;
      consumed += e.size();
    }
  }
  if (in.compare(0, consumed, reencoded) != 0) std::abort();
  return 0;
}
