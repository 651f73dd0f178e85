// Drives CopilotKit's runtime as its React front end does, for tests/compat/test_copilotkit.py.
//
// The front end's agent is @copilotkit/core's ProxiedCopilotRuntimeAgent (an @ag-ui/client
// HttpAgent speaking the runtime's v2 single-route envelope {method, params, body}); this script
// makes the calls CopilotKitCore makes with it: a turn is addMessage + runAgent with the app's
// properties as forwardedProps; Stop is agent.abortRun() (CopilotKitCore.stopAgent), which posts
// "agent/stop"; an interrupt is answered through the ɵInterruptState the framework adapters
// share (its "resume" action: tool results added as messages, then runAgent({resume}));
// suggestions clone the agent and run it with toolChoice copilotkitSuggest and the suggest tool
// (CopilotKitCore.generateSuggestions on a single-route runtime).
//
// Protocol: one JSON command per stdin line, one JSON answer per stdout line (same "id").
//   {"id", "op": "turn", "threadId", "text", "props": {...forwardedProps}, "stopOn"?: EVENT_TYPE,
//    "leaveOn"?: EVENT_TYPE, "headers"?: {...}}   stopOn: Stop at that event; leaveOn: the page
//    goes away (its request is aborted, nothing else: what closing the tab does); headers: the
//    provider's headers, sent to the runtime from now on
//   {"id", "op": "resume", "threadId", "props", "status": "resolved"|"cancelled", "payload"?}
//   {"id", "op": "suggest", "threadId", "props"}
// Answer: {"id", "events": [AG-UI events the front end received], "error": null | string,
//          "stoppedAfterMs": ms from Stop (or leaving) to the end of the run, "messages": [...]}
// Env: COPILOTKIT_RUNTIME_URL (the runtime's single route).
import { createInterface } from "node:readline";
import { randomUUID } from "node:crypto";
import { HttpAgent } from "@ag-ui/client";
import { ProxiedCopilotRuntimeAgent, ɵInterruptState as InterruptState } from "@copilotkit/core";

const runtimeUrl = process.env.COPILOTKIT_RUNTIME_URL;
const threads = new Map(); // threadId -> {agent, interrupts}

function thread(threadId) {
  if (!threads.has(threadId)) {
    const agent = new ProxiedCopilotRuntimeAgent({ runtimeUrl, agentId: "default", transport: "single" });
    agent.threadId = threadId;
    threads.set(threadId, { agent, interrupts: new InterruptState() });
  }
  return threads.get(threadId);
}

async function run(agent, input, command) {
  const events = [];
  let stopAt = null;
  let error = null;
  const subscriber = {
    onEvent: ({ event }) => {
      events.push(event);
      if (command.stopOn && stopAt === null && event.type === command.stopOn) {
        stopAt = Date.now();
        agent.abortRun(); // CopilotKitCore.stopAgent(): the Stop button
      }
      if (command.leaveOn && stopAt === null && event.type === command.leaveOn) {
        stopAt = Date.now();
        HttpAgent.prototype.abortRun.call(agent); // only the request goes: a tab that closes
      }
    },
  };
  try {
    await agent.runAgent({ tools: [], context: [], ...input }, subscriber);
  } catch (err) {
    error = String(err?.message ?? err);
  }
  return {
    events,
    error,
    stoppedAfterMs: stopAt === null ? null : Date.now() - stopAt,
    messages: agent.messages,
  };
}

async function handle(command) {
  const { agent, interrupts } = thread(command.threadId);
  if (command.headers) agent.headers = command.headers; // the provider's `headers`
  if (command.op === "turn") {
    agent.addMessage({ id: randomUUID(), role: "user", content: command.text });
    const result = await run(agent, { forwardedProps: command.props }, command);
    const finished = result.events.find((e) => e.type === "RUN_FINISHED");
    const pending = finished?.outcome?.type === "interrupt" ? finished.outcome.interrupts : [];
    if (pending.length) interrupts.setStandard(pending);
    else interrupts.clear();
    return result;
  }
  if (command.op === "resume") {
    const action =
      command.status === "cancelled" ? interrupts.cancel() : interrupts.resolve(command.payload);
    if (action.kind !== "resume") return { events: [], error: `interrupt state answered ${action.kind}` };
    for (const { toolCallId, content } of action.toolResults) {
      agent.addMessage({ id: randomUUID(), role: "tool", toolCallId, content });
    }
    interrupts.clear();
    return run(agent, { forwardedProps: command.props, resume: action.resume }, command);
  }
  if (command.op === "suggest") {
    const suggestion = agent.clone();
    suggestion.threadId = randomUUID();
    suggestion.addMessage({ id: suggestion.threadId, role: "user", content: "Suggest what the user could say next." });
    return run(
      suggestion,
      {
        forwardedProps: { ...command.props, toolChoice: { type: "function", function: { name: "copilotkitSuggest" } } },
        tools: [SUGGEST_TOOL],
      },
      command,
    );
  }
  return { events: [], error: `unknown op ${command.op}` };
}

// The tool CopilotKitCore.generateSuggestions sends (its SUGGEST_TOOL, shortened).
const SUGGEST_TOOL = {
  name: "copilotkitSuggest",
  description: "Suggest what the user could say next",
  parameters: {
    type: "object",
    properties: {
      suggestions: {
        type: "array",
        items: {
          type: "object",
          properties: { title: { type: "string" }, message: { type: "string" } },
          required: ["title", "message"],
        },
      },
    },
    required: ["suggestions"],
  },
};

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  const command = JSON.parse(line);
  let answer;
  try {
    answer = await handle(command);
  } catch (err) {
    answer = { events: [], error: `driver: ${err?.stack ?? err}` };
  }
  process.stdout.write(JSON.stringify({ id: command.id, ...answer }) + "\n");
}
