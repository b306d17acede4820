#!/usr/bin/env node
// An MCP client for cortex's end-to-end tests, built on the official TypeScript SDK
// (npm @modelcontextprotocol/sdk, revision 2025-11-25 and its experimental tasks), which
// nobody here wrote. The same line protocol as client.py: one JSON command per line on
// stdin, one JSON answer per line on stdout.
//
//   client.mjs --http URL --token T
//   client.mjs --stdio CMD [ARG...]
//
// Commands: {"op": "tools"}, {"op": "call", "name", "args"}, {"op": "stream", "name",
// "args"} (callToolStream: as a task where the tool says it may be one; every message it
// yields), {"op": "get"|"result"|"cancel", "id"}, {"op": "list"}.

import { createInterface } from "node:readline";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";

const argv = process.argv.slice(2);
let transport;
if (argv[0] === "--http") {
  const url = argv[1];
  const token = argv[argv.indexOf("--token") + 1];
  transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
} else if (argv[0] === "--stdio") {
  transport = new StdioClientTransport({
    command: argv[1],
    args: argv.slice(2),
    env: { ...process.env },
    stderr: "inherit",
  });
} else {
  console.error("usage: client.mjs --http URL --token T | --stdio CMD [ARG...]");
  process.exit(2);
}

const client = new Client({ name: "cortex-tests-ts", version: "1.0.0" }, { capabilities: {} });
const out = (v) => process.stdout.write(JSON.stringify(v) + "\n");

async function run(cmd) {
  switch (cmd.op) {
    case "tools": {
      const t = await client.listTools();
      return { tools: t.tools.map((x) => x.name), execution: Object.fromEntries(t.tools.map((x) => [x.name, x.execution ?? null])) };
    }
    case "call": {
      const r = await client.callTool({ name: cmd.name, arguments: cmd.args ?? {} });
      return { ok: !r.isError, text: r.content.map((c) => c.text ?? "").join(""), structured: r.structuredContent ?? null };
    }
    case "stream": {
      const seen = [];
      for await (const m of client.experimental.tasks.callToolStream(
        { name: cmd.name, arguments: cmd.args ?? {} },
        CallToolResultSchema,
      )) {
        if (m.type === "error") seen.push({ type: "error", message: String(m.error?.message ?? m.error) });
        else seen.push(m);
      }
      return { messages: seen };
    }
    case "get":
      return await client.experimental.tasks.getTask(cmd.id);
    case "result":
      return await client.experimental.tasks.getTaskResult(cmd.id, CallToolResultSchema);
    case "cancel":
      return await client.experimental.tasks.cancelTask(cmd.id);
    case "list":
      return await client.experimental.tasks.listTasks();
    default:
      return { error: `unknown op ${cmd.op}` };
  }
}

// The revision the handshake settled on, as the SDK hands it to its transport.
let negotiated = "";
const setVersion = transport.setProtocolVersion?.bind(transport);
transport.setProtocolVersion = (v) => {
  negotiated = v;
  setVersion?.(v);
};
try {
  await client.connect(transport);
} catch (e) {
  out({ ready: false, error: String(e?.message ?? e) });
  process.exit(1);
}
out({ ready: true, protocol: negotiated, capabilities: client.getServerCapabilities() });
const rl = createInterface({ input: process.stdin });
for await (const line of rl) {
  if (!line.trim()) continue;
  try {
    out(await run(JSON.parse(line)));
  } catch (e) {
    out({ error: String(e?.message ?? e) });
  }
}
await client.close();
