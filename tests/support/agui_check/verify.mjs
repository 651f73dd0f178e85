#!/usr/bin/env node
// verify.mjs — replays recorded AG-UI SSE streams through the OFFICIAL client
// (@ag-ui/client 1.0.0, HttpAgent.runAgent), so the official SSE parser, the
// compatibility layer, the zod schema enforcement and verifyEvents all run.
//
// Usage:  node verify.mjs [--json] [--chunk N] [--resume-payload JSON] RUN0.sse [RUN1.sse ...]
//
// The files are consecutive runs on ONE agent and thread. When a run ends with
// an interrupt (RUN_FINISHED outcome "interrupt") the next run is sent as its
// resume (official buildResumeArray, every interrupt resolved with the resume
// payload, default {"approved":true}); otherwise the next run is a plain run.
// Each file is served by a custom fetch in N-byte chunks (default 7), so frames
// split across reads are exercised.
//
// A run FAILS on: any error thrown by the client pipeline (parse, schema, verify),
// any client warning (stripped/unknown fields, dropped events, legacy shapes:
// they mean the wire format is wrong), CR characters (the client splits frames
// on "\n\n" only), and a stream that ends without RUN_FINISHED or RUN_ERROR
// (the official client would silently resolve).
//
// Exit codes: 0 all runs pass, 1 a run failed, 2 tool failure (bad usage, file
// or @ag-ui/client not found). The client is resolved from NODE_PATH (ESM ignores
// NODE_PATH, so it is loaded with createRequire), the cwd, or this folder.

import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

function usage(message) {
  if (message) process.stderr.write(`verify.mjs: ${message}\n`);
  process.stderr.write("usage: node verify.mjs [--json] [--chunk N] [--resume-payload JSON] RUN.sse [RUN.sse ...]\n");
  process.exit(2);
}

function loadClient() {
  const bases = [
    ...(process.env.NODE_PATH || "").split(path.delimiter).filter(Boolean).map((p) => path.join(p, "noop.js")),
    path.join(process.cwd(), "noop.js"),
    fileURLToPath(import.meta.url),
  ];
  for (const base of bases) {
    try {
      return createRequire(base)("@ag-ui/client");
    } catch {
      // try the next base
    }
  }
  process.stderr.write("verify.mjs: cannot load @ag-ui/client; set NODE_PATH to a node_modules holding @ag-ui/client@1.0.0\n");
  process.exit(2);
}

const opts = { files: [], json: false, chunk: 7, resumePayload: { approved: true } };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const arg = argv[i];
  if (arg === "--json") opts.json = true;
  else if (arg === "--chunk") opts.chunk = Math.max(1, Number(argv[++i]) || usage("--chunk needs a number"));
  else if (arg === "--resume-payload") {
    try {
      opts.resumePayload = JSON.parse(argv[++i]);
    } catch {
      usage("--resume-payload needs JSON");
    }
  } else if (arg === "-h" || arg === "--help") usage();
  else if (arg.startsWith("--")) usage(`unknown option ${arg}`);
  else opts.files.push(arg);
}
if (opts.files.length === 0) usage("no capture files given");

const streams = opts.files.map((file) => {
  try {
    return fs.readFileSync(file);
  } catch (error) {
    process.stderr.write(`verify.mjs: cannot read ${file}: ${error.message}\n`);
    process.exit(2);
  }
});

const client = loadClient();
const { HttpAgent, buildResumeArray } = client;

// Client warnings are findings; "Agent execution failed" errors are reported via onRunFailed.
const warnings = [];
const originalWarn = console.warn;
const originalError = console.error;
console.warn = (...args) => warnings.push(args.map(String).join(" "));
console.error = () => {};
delete process.env.SUPPRESS_TRANSFORMATION_WARNINGS;

function firstThreadId(bytes) {
  const match = /"threadId"\s*:\s*"([^"]+)"/.exec(bytes.toString("utf8"));
  return match ? match[1] : undefined;
}

let served = 0;
const requests = [];
async function replayFetch(_url, init) {
  const bytes = streams[Math.min(served++, streams.length - 1)];
  try {
    requests.push(JSON.parse(init.body));
  } catch {
    requests.push(null);
  }
  const size = opts.chunk;
  const body = new ReadableStream({
    start(controller) {
      for (let offset = 0; offset < bytes.length; offset += size) {
        controller.enqueue(new Uint8Array(bytes.subarray(offset, offset + size)));
      }
      controller.close();
    },
  });
  return new Response(body, { status: 200, headers: { "content-type": "text/event-stream" } });
}

function errorText(error) {
  return String(error && error.message ? error.message : error).replace(/\s*\n\s*/g, " ");
}

const runs = [];
// A new agent (a fresh client-side thread) starts each chain: at the first stream, when the
// thread id changes, and after a run that did not end in an interrupt. Within a chain, a run
// that ended in an interrupt is resumed by the next stream, as a real client would do it.
let agent = null;
function freshAgent(index) {
  served = index;
  return new HttpAgent({
    url: "http://replay.invalid/agui",
    threadId: firstThreadId(streams[index]),
    initialMessages: [{ id: "user-1", role: "user", content: "Hello" }],
    fetch: replayFetch,
  });
}

let params = {};
for (let index = 0; index < streams.length; index++) {
  const previous = runs[runs.length - 1];
  if (!agent || !previous || previous.outcome !== "interrupt" || agent.threadId !== firstThreadId(streams[index])) {
    agent = freshAgent(index);
    params = {};
  }
  const run = { index, file: opts.files[index], events: [], terminal: null, outcome: null, errors: [], warnings: [] };
  runs.push(run);
  if (streams[index].includes(0x0d)) {
    run.errors.push("CR (\\r) in the stream: @ag-ui/client splits frames on \"\\n\\n\" only, use \\n line endings");
  }
  const warningsBefore = warnings.length;
  let failure = null;
  const subscriber = {
    onEvent: ({ event }) => {
      run.events.push(event.type);
    },
    onRunFinishedEvent: (p) => {
      run.terminal = "RUN_FINISHED";
      run.outcome = p.outcome;
      if (p.outcome === "interrupt") run.interrupts = p.interrupts;
    },
    onRunErrorEvent: ({ event }) => {
      run.terminal = "RUN_ERROR";
      run.runError = { message: event.message, code: event.code };
    },
    onRunFailed: ({ error }) => {
      failure = failure || errorText(error);
    },
  };
  try {
    await agent.runAgent(params, subscriber);
  } catch (error) {
    failure = failure || errorText(error);
  }
  if (failure) run.errors.push(`client error after ${run.events.length} event(s): ${failure}`);
  run.warnings = warnings.slice(warningsBefore);
  for (const warning of run.warnings) run.errors.push(`client warning: ${warning.replace(/\s*\n\s*/g, " ").slice(0, 500)}`);
  if (!failure && !run.terminal) run.errors.push("stream ended without RUN_FINISHED or RUN_ERROR");
  run.ok = run.errors.length === 0;
  if (failure) break; // the agent is in an undefined state after a fatal error

  params = {};
  if (run.outcome === "interrupt" && index + 1 < streams.length) {
    // An interrupt that has expired can only be cancelled (the client refuses anything else).
    const now = Date.now();
    const responses = Object.fromEntries(
      run.interrupts.map((interrupt) =>
        interrupt.expiresAt && Date.parse(interrupt.expiresAt) <= now
          ? [interrupt.id, { status: "cancelled" }]
          : [interrupt.id, { status: "resolved", payload: opts.resumePayload }],
      ),
    );
    params = { resume: buildResumeArray(run.interrupts, responses) };
    run.resumeSent = params.resume;
  }
}
for (let index = runs.length; index < streams.length; index++) {
  runs.push({ index, file: opts.files[index], events: [], terminal: null, outcome: null, ok: false,
    errors: ["not replayed: an earlier run failed"], warnings: [] });
}

console.warn = originalWarn;
console.error = originalError;

const ok = runs.every((run) => run.ok);
if (opts.json) {
  process.stdout.write(JSON.stringify({ ok, runs, requests }, null, 2) + "\n");
} else {
  for (const run of runs) {
    const extra = run.interrupts ? ` interrupts=${JSON.stringify(run.interrupts.map((i) => i.id))}` : "";
    const error = run.runError ? ` error=${JSON.stringify(run.runError)}` : "";
    process.stdout.write(
      `run ${run.index} ${run.ok ? "PASS" : "FAIL"} ${path.basename(run.file)}: ${run.events.length} events` +
        ` terminal=${run.terminal} outcome=${run.outcome}${extra}${error}\n`,
    );
    for (const message of run.errors) process.stdout.write(`  ERROR: ${message}\n`);
  }
  process.stdout.write(ok ? "PASS\n" : "FAIL\n");
}
process.exit(ok ? 0 : 1);
