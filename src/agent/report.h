// The vm_agent report: one JSON document assembled by tryboxd from its own records
// (docs/agent.md, "The report"), and its text rendering for people. The text is derived
// from the JSON alone, so the two never disagree.
//
// Trust layout of the text: every line is either written by tryboxd (labels, numbers, ids,
// hashes, outcome words it chose), or it is a quoted line that starts with kQuotePrefix.
// Untrusted strings that sit on a trusted line (argv, paths, the task) are JSON string
// literals, so they cannot contain a line break. Nothing the guest or the model writes can
// therefore begin a line of its own.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace trybox::agent {

inline constexpr const char* kReportSchema = "trybox.report/1";
inline constexpr const char* kQuotePrefix = "    | ";

// Text for people, from a report document. Never throws on a well-formed report; fields it
// does not know are ignored.
std::string RenderReportText(const nlohmann::json& report);

}  // namespace trybox::agent
