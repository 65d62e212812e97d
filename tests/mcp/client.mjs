// Drives `trybox mcp` with the official MCP TypeScript SDK client, so the server is checked
// against what real MCP clients do, not only against our own reading of the spec.
//
//   node tests/mcp/client.mjs [TRYBOX_BINARY] [ARGUMENTS_JSON]
//
// TRYBOX_BINARY (or $TRYBOX_BIN, default `trybox`) is started as `TRYBOX_BINARY mcp` with
// this process's whole environment. ARGUMENTS_JSON (or $MCP_CALL_ARGS) is the vm_agent
// arguments object; without it the tool is listed but not called.
//
// Prints one JSON line: {server, protocolVersion, tools, result, progress}. `result` is the
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

const transport = new StdioClientTransport({
  command: binary,
  args: ["mcp"],
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
const out = { server: null, protocolVersion: null, tools: [], result: null, progress: [] };
try {
  await client.connect(transport);
  out.server = client.getServerVersion();
  out.protocolVersion = protocolVersion;
  if (out.server?.name !== "trybox") fail(`server name is ${JSON.stringify(out.server)}`);
  if (!client.getServerCapabilities()?.tools) fail("server does not declare the tools capability");

  const { tools } = await client.listTools();
  out.tools = tools;
  const tool = tools.find((t) => t.name === "vm_agent");
  if (!tool) fail(`no vm_agent among ${JSON.stringify(tools.map((t) => t.name))}`);
  if (tool.inputSchema?.type !== "object") fail("vm_agent's inputSchema is not an object schema");

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
