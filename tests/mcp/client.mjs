// Drives `trybox mcp` with the official MCP TypeScript SDK client, so the server is checked
// against what real MCP clients do, not only against our own reading of the spec.
//
//   node tests/mcp/client.mjs [TRYBOX_BINARY] [ARGUMENTS_JSON]
//
// TRYBOX_BINARY (or $TRYBOX_BIN, default `trybox`) is started as `TRYBOX_BINARY mcp` with
// this process's whole environment. ARGUMENTS_JSON (or $MCP_CALL_ARGS) is the vm_agent
// arguments object; without it the tool is listed but not called.
//
// With $MCP_SCRIPT (a JSON array of {name, arguments}), calls those tools in order instead;
// the string "$VM" anywhere in an arguments object stands for the `vm` of the last
// vm_create's structuredContent, and the results land in `results`. $MCP_SERVER_ARGS (a
// JSON array) is appended to `mcp` (e.g. ["--tools", "vm_exec"]).
//
// Prints one JSON line: {server, protocolVersion, tools, result, progress, results}. `result` is the
// CallToolResult as received, an error result (isError) included. Exits 1 on any protocol
// failure: the server's handshake, its tool list, or the call itself failing at the
// JSON-RPC level (a thrown McpError, a timeout, a structuredContent that does not match the
// tool's outputSchema).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

function fail(message) {
  process.stderr.write(`client.mjs: ${message}\n`);
  process.exit(1);
}

const binary = process.argv[2] || process.env.TRYBOX_BIN || "trybox";
const argsText = process.argv[3] || process.env.MCP_CALL_ARGS || "";
let callArgs = null;
if (argsText) {
  try {
    callArgs = JSON.parse(argsText);
  } catch (e) {
    fail(`arguments are not JSON: ${e.message}`);
  }
}

let script = null;
let serverArgs = [];
try {
  if (process.env.MCP_SCRIPT) script = JSON.parse(process.env.MCP_SCRIPT);
  if (process.env.MCP_SERVER_ARGS) serverArgs = JSON.parse(process.env.MCP_SERVER_ARGS);
} catch (e) {
  fail(`MCP_SCRIPT or MCP_SERVER_ARGS is not JSON: ${e.message}`);
}

const transport = new StdioClientTransport({
  command: binary,
  args: ["mcp", ...serverArgs],
  env: { ...process.env },  // the SDK passes only a few variables unless told otherwise
  stderr: "inherit",
});
let protocolVersion = null;
// The SDK reports the negotiated version to transports that want it (HTTP ones); this one
// only records it.
transport.setProtocolVersion = (v) => {
  protocolVersion = v;
};

const client = new Client({ name: "trybox-sdk-test", version: "1.0.0" }, { capabilities: {} });
const out = {
  server: null,
  protocolVersion: null,
  tools: [],
  result: null,
  progress: [],
  results: [],
};
try {
  await client.connect(transport);
  out.server = client.getServerVersion();
  out.protocolVersion = protocolVersion;
  if (out.server?.name !== "trybox") fail(`server name is ${JSON.stringify(out.server)}`);
  if (!client.getServerCapabilities()?.tools) fail("server does not declare the tools capability");

  const { tools } = await client.listTools();
  out.tools = tools;
  for (const t of tools) {
    if (t.inputSchema?.type !== "object") fail(`${t.name}'s inputSchema is not an object schema`);
  }
  const tool = tools.find((t) => t.name === "vm_agent");
  if (!tool && callArgs !== null) {
    fail(`no vm_agent among ${JSON.stringify(tools.map((t) => t.name))}`);
  }

  let vm = null;
  for (const step of script || []) {
    const args = JSON.parse(JSON.stringify(step.arguments || {}).replaceAll('"$VM"', JSON.stringify(vm)));
    // callTool checks structuredContent against the tool's outputSchema (a mismatch throws).
    const r = await client.callTool({ name: step.name, arguments: args });
    out.results.push(r);
    if (step.name === "vm_create" && r.structuredContent?.vm) vm = r.structuredContent.vm;
  }

  if (callArgs !== null) {
    out.result = await client.callTool({ name: "vm_agent", arguments: callArgs }, undefined, {
      onprogress: (p) => out.progress.push(p),
      // A run takes minutes: wait as long as progress keeps coming, up to an hour.
      timeout: Number(process.env.MCP_CALL_TIMEOUT_MS || 600000),
      resetTimeoutOnProgress: true,
      maxTotalTimeout: 3600000,
    });
  }
} catch (e) {
  fail(`protocol failure: ${e?.stack || e}`);
} finally {
  await client.close().catch(() => {});
}
process.stdout.write(JSON.stringify(out) + "\n");
