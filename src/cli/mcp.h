// `trybox mcp`: a Model Context Protocol server on stdio. Its tools: `vm_agent`, which hands a
// task to a second model working inside a throwaway VM (tryboxd runs that loop), and the VM
// tools of cli/mcp_tools.h (vm_create, vm_exec, vm_read_file, vm_write_file, vm_list_dir,
// vm_destroy) for an assistant that works in a VM itself. Wire and rules:
// docs/protocol/mcp.md.
//
// Transport: JSON-RPC 2.0, one message per line (no embedded newlines) in both directions;
// nothing but protocol messages is written to `out_fd`, logs go to stderr.
//
// Threads: the calling thread reads `in_fd` and answers everything but tools/call itself.
// Each tools/call runs on its own thread with its own daemon connection, so a long run
// never blocks pings, listings or cancellations. Writes to `out_fd` are serialised, one
// whole line at a time.
#pragma once

#include <string>
#include <vector>

#include "cli/agent_settings.h"
#include "util/paths.h"

namespace trybox::cli {

struct McpOptions {
  ModelFlags model;                        // `trybox mcp --provider P --model M`
  Paths paths = Paths::FromEnvironment();  // the daemon's socket and $config/agent.json
  EnvLookup env = ProcessEnv();            // ANTHROPIC_* / OPENAI_* for ResolveModel
  bool autostart = true;                   // start tryboxd if none answers (tests: off)
  size_t max_line_bytes = 16u << 20;       // longer messages are refused, not buffered
  // The tools offered, in listing order (mcp::ChooseTools); empty: all of them.
  std::vector<std::string> tools;
};

// Serves until `in_fd` reaches EOF (the client's shutdown signal on stdio), then resets the
// daemon streams of calls still running (the daemon stops their runs' current step; a run
// can be resumed later), answers those calls with a tool error saying so, waits for their
// threads, closes the session's daemon connection (tryboxd then destroys the VMs vm_create
// made without `keep`) and returns 0. Returns 1 if `in_fd` fails
// with a read error. Ignores SIGPIPE for the process: a client that closed its end is seen
// as a failed write, not a signal. Neither fd is closed.
int RunMcpServer(const McpOptions& options, int in_fd, int out_fd);

}  // namespace trybox::cli
