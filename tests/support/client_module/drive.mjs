#!/usr/bin/env node
// drive.mjs: one scenario of agui-adapter-client.mjs / agui-adapter-agent.mjs under @ag-ui/client 1.0.
//
// Usage: node drive.mjs SPEC.json   (prints one JSON report on stdout)
//
// The test copies this script next to the two modules AS THE ADAPTER SERVES THEM, with a
// node_modules holding @ag-ui/client 1.0.0, so "./agui-adapter-agent.mjs" and "@ag-ui/client"
// resolve as they would in an app. Scenarios (spec.scenario):
//   run      AdapterHttpAgent.runAgent(): every event a subscriber receives, the assistant text
//   connect  a fresh agent's connectAgent() (spec.runId: connectAgent({runId}))
//   abort    runAgent(), abortRun() once the session event arrived, then a new turn at once
//   follow   followRun() from spec.lastEventId
//   parser   SSEParser on awkward input
// Any client warning or error (the official verifier's included) is reported in `errors`.
import fs from "node:fs";
import { AdapterHttpAgent, SSEParser, followRun } from "./agui-adapter-agent.mjs";

const spec = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const warnings = [];
console.warn = (...args) => warnings.push(args.map(String).join(" "));
console.error = (...args) => warnings.push(`console.error: ${args.map(String).join(" ")}`);
delete process.env.SUPPRESS_TRANSFORMATION_WARNINGS;

function text(error) {
  return String(error && error.message ? error.message : error);
}

// spec.threadsAnswer: GET /threads/{id} answered with this JSON (the shape the adapter's
// thread route gives), every other request going to the adapter
const threadLookups = [];
function transport() {
  if (!spec.threadsAnswer) return undefined;
  return async (url, init) => {
    const path = new URL(url).pathname;
    if ((init?.method ?? "GET") === "GET" && /^\/threads\/[^/]+$/.test(path)) {
      threadLookups.push(path);
      return new Response(JSON.stringify(spec.threadsAnswer), { status: 200, headers: { "Content-Type": "application/json" } });
    }
    return fetch(url, init);
  };
}

function newAgent(threadId, messages = []) {
  return new AdapterHttpAgent({
    url: spec.url,
    fetch: transport(),
    threadId,
    initialMessages: messages,
    headers: spec.headers || {},
    reconnect: { initialDelayMs: 50, maxDelayMs: 400, ...(spec.reconnect || {}) },
    cancelOnAbort: spec.cancelOnAbort !== false,
  });
}

/** Run `start(subscriber)` and collect what a subscriber sees. */
async function observe(agent, start) {
  const seen = { events: [], errors: [], terminal: null, outcome: null };
  const subscriber = {
    onEvent: ({ event }) => {
      seen.events.push(event);
    },
    onRunFinishedEvent: (p) => {
      seen.terminal = "RUN_FINISHED";
      seen.outcome = p.outcome;
    },
    onRunErrorEvent: ({ event }) => {
      seen.terminal = "RUN_ERROR";
      seen.code = event.code;
    },
    onRunFailed: ({ error }) => {
      seen.errors.push(`run failed: ${text(error)}`);
    },
  };
  const before = warnings.length;
  try {
    seen.result = (await start(subscriber)) ?? null;
  } catch (error) {
    seen.errors.push(`rejected: ${text(error)}`);
  }
  for (const warning of warnings.slice(before)) seen.errors.push(`warning: ${warning}`);
  seen.text = agent.messages
    .filter((m) => m.role === "assistant" && typeof m.content === "string")
    .map((m) => m.content)
    .join("\n");
  return seen;
}

function userMessage(content) {
  return { id: `user-${Math.random().toString(16).slice(2, 10)}`, role: "user", content };
}

async function scenarioRun() {
  const agent = newAgent(spec.threadId, [userMessage(spec.text)]);
  const seen = await observe(agent, (s) => agent.runAgent({ runId: spec.runId, forwardedProps: { iacCode: spec.iacCode } }, s));
  return { ...seen, lastRun: agent.lastRun && { runId: agent.lastRun.runId, lastEventId: agent.lastRun.lastEventId } };
}

async function scenarioConnect() {
  const agent = newAgent(spec.threadId);
  const params = spec.runId ? { runId: spec.runId } : undefined;
  const seen = await observe(agent, (s) => agent.connectAgent(params, s));
  return { ...seen, threadLookups };
}

async function scenarioAbort() {
  const agent = newAgent(spec.threadId, [userMessage(spec.text)]);
  let session = null;
  let abortedAt = 0;
  const first = await observe(agent, (s) => {
    const subscriber = {
      ...s,
      onCustomEvent: ({ event }) => {
        if (event.name === "iac-code.session.v1" && !session) {
          session = event.value;
          setTimeout(() => {
            abortedAt = Date.now();
            agent.abortRun();
          }, 0);
        }
      },
    };
    return agent.runAgent({ runId: spec.runId, forwardedProps: { iacCode: spec.iacCode } }, subscriber);
  });
  const abortReturnedMs = Date.now() - abortedAt;
  agent.addMessage(userMessage(spec.secondText));
  const secondStart = Date.now();
  const second = await observe(agent, (s) =>
    agent.runAgent({ runId: spec.secondRunId, forwardedProps: { iacCode: spec.iacCode } }, s),
  );
  return { first, second, session, abortReturnedMs, abortToSecondDoneMs: Date.now() - abortedAt, secondMs: Date.now() - secondStart };
}

async function scenarioFollow() {
  const events = [];
  const ids = [];
  let terminal = null;
  const errors = [];
  try {
    terminal = await followRun(spec.url, {
      threadId: spec.threadId,
      runId: spec.runId,
      lastEventId: spec.lastEventId,
      headers: spec.headers || {},
      reconnect: { initialDelayMs: 50, maxDelayMs: 400 },
      onEvent: (event, id) => {
        events.push(event);
        ids.push(id);
      },
    });
  } catch (error) {
    errors.push(text(error));
  }
  return { events, ids, terminal, errors };
}

function scenarioParser() {
  const failures = [];
  const check = (name, chunks, expected) => {
    const parser = new SSEParser();
    const got = chunks.flatMap((c) => parser.push(c)).map((e) => [e.id, e.data]);
    if (JSON.stringify(got) !== JSON.stringify(expected)) failures.push(`${name}: ${JSON.stringify(got)}`);
  };
  check("plain", ["id: 1\ndata: {}\n\n"], [["1", "{}"]]);
  check("split everywhere", ["i", "d: 7\nda", "ta: a\n", "data: b\n", "\n"], [["7", "a\nb"]]);
  check("crlf across chunks", ["id: 2\r", "\ndata: x\r\n\r", "\n"], [["2", "x"]]);
  check("cr only", ["id: 3\rdata: y\r\rdata: not yet"], [["3", "y"]]);
  check("comments and retry", [": heartbeat\n\nretry: 10\nid: 4\ndata:z\n\n"], [["4", "z"]]);
  check("no id", ["data: q\n\n"], [[null, "q"]]);
  check("cut before the blank line", ["id: 5\ndata: {\"type\":\"TEXT"], []);
  check("id without data dispatches nothing", ["id: 6\n\ndata: w\n\n"], [[null, "w"]]);
  return { failures };
}

const scenarios = { run: scenarioRun, connect: scenarioConnect, abort: scenarioAbort, follow: scenarioFollow, parser: scenarioParser };
const report = await scenarios[spec.scenario]();
process.stdout.write(JSON.stringify(report));
process.exit(0);
