// The JSON of what crosses between tryboxd and trybox-agent (docs/protocol/agent.md): the
// loop's limits, usage, turn times and result, and the model settings without their key.
// The daemon reads what the agent sends with these parsers and trusts none of it: a field
// of the wrong type is an error naming it, text is capped and made valid UTF-8.
#pragma once

#include <nlohmann/json.hpp>

#include "agent/loop.h"
#include "agent/model.h"
#include "util/status.h"

namespace trybox::agent {

using Json = nlohmann::json;

Json UsageToJson(const RunUsage& u);
Result<RunUsage> UsageFromJson(const Json& j);
Json TurnTimesToJson(const std::vector<TurnTime>& t);
Result<std::vector<TurnTime>> TurnTimesFromJson(const Json& j);
Json LimitsToJson(const LoopLimits& l);
Result<LoopLimits> LimitsFromJson(const Json& j);

// The settings the agent process may know: everything but the key.
Json SettingsWithoutKey(const ModelSettings& s);
Result<ModelSettings> SettingsFromJson(const Json& j);

// A LoopResult without its pending entry (sent apart, as data).
Json ResultToJson(const LoopResult& r);
Result<LoopResult> ResultFromJson(const Json& j);

// A probe's outcome as the agent reports it.
Json ProbeOutcomeToJson(const Outcome& o);
Outcome ProbeOutcomeFromJson(const Json& j);

}  // namespace trybox::agent
