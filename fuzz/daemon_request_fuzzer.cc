// libFuzzer target for the daemon's request parsers (src/daemon/requests.h): arbitrary
// bytes, parsed as JSON the way the channel does, then given to every verb's parser. None
// may throw or crash; each gives a request or an error naming a field.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "daemon/requests.h"

using trybox::daemon::Json;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Json j = Json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  namespace d = trybox::daemon;
  (void)d::ParseCreate(j);
  (void)d::ParseVmRequest(j);
  (void)d::ParseExec(j);
  (void)d::ParsePut(j);
  (void)d::ParseGet(j);
  (void)d::ParseAudit(j);
  (void)d::ParseWorkspaceIn(j);
  (void)d::ParseCollect(j);
  (void)d::ParseDiff(j);
  (void)d::ParseAgent(j);
  (void)d::ParseAgentContinue(j, true);
  (void)d::ParseAgentContinue(j, false);
  (void)d::ParseRunRequest(j);
  (void)d::ParseListLimit(j);
  (void)d::ParsePrune(j);
  auto exec = d::ParseExec(j);
  if (exec.ok() && exec->argv.empty()) std::abort();  // a parsed exec always has a command
  auto create = d::ParseCreate(j);
  if (create.ok() &&
      (create->memory_mib < d::kMinMemoryMib || create->memory_mib > d::kMaxMemoryMib)) {
    std::abort();
  }
  return 0;
}
