// libFuzzer target for what the host reads from a guest and from the trybox-agent process:
// arbitrary bytes are decoded as frames (src/channel/frame.h) and every JSON payload goes
// through the typed readers the daemon uses on it (exec results and events, file results
// and meta events, resets; the agent process's loop results, usage, turn times and
// transcript entries; a stored run's state). None may throw or crash, and a result read as
// an exit code must carry one in range.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "agent/run_wire.h"
#include "channel/frame.h"
#include "daemon/guest_ops.h"
#include "daemon/run_state.h"

using trybox::daemon::Json;

namespace {

void ReadAll(const Json& j) {
  namespace d = trybox::daemon;
  namespace a = trybox::agent;
  d::ExecResult r = d::ExecResultFromGuest(j);
  if (r.outcome == d::ExecOutcome::kExited &&
      (!r.exit_code || *r.exit_code < 0 || *r.exit_code > 255)) {
    std::abort();
  }
  (void)r.ToJson().dump();
  std::string kind;
  int64_t bytes = 0;
  (void)d::FileEndStatus(j, &kind, &bytes);
  (void)d::ResetReason(j);
  (void)d::GuestExecEvent(j);
  (void)d::GuestMetaEvent(j);
  (void)a::ResultFromJson(j);
  (void)a::UsageFromJson(j);
  (void)a::TurnTimesFromJson(j);
  (void)a::LimitsFromJson(j);
  (void)a::SettingsFromJson(j);
  (void)a::ProbeOutcomeFromJson(j);
  (void)a::EntryFromJson(j);
  (void)d::RunState::FromJson(j).ToJson().dump();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trybox::channel::FrameDecoder dec;
  dec.Feed(std::string_view(reinterpret_cast<const char*>(data), size));
  bool any = false;
  for (;;) {
    auto f = dec.Next();
    if (!f.ok()) break;
    any = true;
    Json j = Json::parse(f->payload, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) ReadAll(j);
  }
  // Inputs that are not frames are read as one JSON body, so the corpus needs no framing.
  if (!any) {
    Json j = Json::parse(data, data + size, nullptr, false);
    if (!j.is_discarded()) ReadAll(j);
  }
  return 0;
}
