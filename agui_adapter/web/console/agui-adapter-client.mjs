// agui-adapter-client.mjs: what a web developer needs beside @ag-ui/client to use agui-adapter well.
//
// Why this module exists: @ag-ui/client 1.0's HttpAgent reads one POST and stops. It discards the
// SSE `id:` fields, so it cannot resume a stream that dropped; it has no connect(), so
// connectAgent() cannot reattach to a run that is still going (after a reload, say); and its
// abortRun() only closes the connection, which the adapter may notice late under some WSGI
// servers, leaving the thread busy. This module adds those three things on top of any HttpAgent
// class, with no dependency of its own (it is served by the adapter as it is, at
// GET /agui-adapter-client.mjs):
//
//   withAdapter(HttpAgent)   a subclass: connect() reattaches through GET /threads/{id} and the
//                            events route; a stream that drops before its terminal event is
//                            resumed with Last-Event-ID (capped exponential backoff, a retry
//                            budget reset by every new event, never after a deliberate abort);
//                            abortRun() also calls the cancel extension, so the thread is free
//                            at once. The agent's own parser, verifier and apply steps still see
//                            exactly one run: the pieces are joined on their ids into one body.
//   getThread(baseUrl, threadId, {headers, fetch})
//   followRun(baseUrl, {threadId, runId, lastEventId, headers, signal, onEvent, fetch, reconnect})
//   cancelExecution(baseUrl, {executionId, threadId, rosInvocationId, headers, fetch})
//   SSEParser                the small SSE reader all of the above use (it keeps the ids).
//
// agui-adapter-agent.mjs (beside this file) is the same agent ready made from @ag-ui/client's
// HttpAgent, for bundlers and Node.

/** Reconnect defaults: the first retry after about 250 ms, doubling up to 5 s, 8 retries without a new event. */
export const DEFAULT_RECONNECT = Object.freeze({
  initialDelayMs: 250,
  maxDelayMs: 5000,
  maxRetries: 8,
  // A stream silent this long is treated as dropped (the adapter sends a heartbeat every 15 s by default).
  idleTimeoutMs: 45000,
});

const TERMINAL = new Set(["RUN_FINISHED", "RUN_ERROR"]);
const SESSION_EVENT = "iac-code.session.v1";
const PLAN = Symbol("agui-adapter.plan");
const RETRYABLE_STATUS = new Set([408, 425, 429, 500, 502, 503, 504]);

/** An HTTP answer the module will not retry (401, 404 RUN_NOT_FOUND, 409 REPLAY_UNAVAILABLE, ...). */
export class AdapterHttpError extends Error {
  constructor(status, payload) {
    const code = payload && typeof payload === "object" ? payload.error?.code : undefined;
    const text = typeof payload === "string" ? payload : JSON.stringify(payload);
    super(`HTTP ${status}: ${text}`);
    this.name = "AdapterHttpError";
    this.status = status;
    this.payload = payload;
    this.code = code;
  }
}

// ---------------------------------------------------------------------------------------- SSE

/**
 * An incremental Server-Sent Events reader (the HTML standard's rules): text in, complete events
 * out as {id, lastEventId, event, data}. `id` is the event's own `id:` field (null when it had
 * none); comments (": heartbeat") and `retry:` are skipped; an event cut off before its blank
 * line is never returned.
 */
export class SSEParser {
  constructor() {
    this.buffer = "";
    this.lastEventId = "";
    this.reset();
  }

  reset() {
    this.data = [];
    this.id = null;
    this.event = "";
  }

  /** Feed decoded text; returns the events it completed. */
  push(text) {
    let buffer = this.buffer + text;
    let hold = "";
    if (buffer.endsWith("\r")) {
      // maybe the first half of a CRLF
      buffer = buffer.slice(0, -1);
      hold = "\r";
    }
    const lines = buffer.split(/\r\n|\r|\n/);
    this.buffer = lines.pop() + hold;
    const out = [];
    for (const line of lines) {
      if (line === "") {
        if (this.data.length > 0) {
          out.push({ id: this.id, lastEventId: this.lastEventId, event: this.event || "message", data: this.data.join("\n") });
        }
        this.reset();
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "data") this.data.push(value);
      else if (field === "event") this.event = value;
      else if (field === "id" && !value.includes("\0")) {
        this.id = value;
        this.lastEventId = value;
      }
    }
    return out;
  }
}

// ---------------------------------------------------------------------------------- utilities

function adapterBase(url) {
  const base = new URL(String(url), globalThis.location?.href);
  base.search = "";
  base.hash = "";
  if (!base.pathname.endsWith("/")) base.pathname += "/";
  return base;
}

function threadUrl(baseUrl, threadId) {
  return new URL(`threads/${encodeURIComponent(threadId)}`, adapterBase(baseUrl));
}

function eventsUrl(baseUrl, threadId, runId) {
  return new URL(
    `threads/${encodeURIComponent(threadId)}/runs/${encodeURIComponent(runId)}/events`,
    adapterBase(baseUrl),
  );
}

function plainHeaders(headers) {
  const out = {};
  if (!headers) return out;
  if (typeof headers.forEach === "function" && !Array.isArray(headers)) {
    headers.forEach((value, key) => {
      out[key] = value;
    });
  } else {
    for (const [key, value] of Array.isArray(headers) ? headers : Object.entries(headers)) out[key] = value;
  }
  return out;
}

function withoutHeaders(headers, names) {
  const drop = new Set(names.map((n) => n.toLowerCase()));
  return Object.fromEntries(Object.entries(plainHeaders(headers)).filter(([k]) => !drop.has(k.toLowerCase())));
}

function defaultFetch(url, init) {
  return globalThis.fetch(url, init);
}

async function httpError(response) {
  const text = await response.text().catch(() => "");
  let payload = text;
  if ((response.headers.get("content-type") || "").includes("application/json")) {
    try {
      payload = JSON.parse(text);
    } catch {
      // keep the text
    }
  }
  return new AdapterHttpError(response.status, payload);
}

function abortError(signal) {
  if (signal?.reason !== undefined) return signal.reason;
  const error = new Error("This operation was aborted");
  error.name = "AbortError";
  return error;
}

function isEventStream(response) {
  return (response.headers.get("content-type") || "").toLowerCase().startsWith("text/event-stream");
}

/** An AbortSignal that fires when any of `signals` does (AbortSignal.any where it is missing). */
function anySignal(signals) {
  const controller = new AbortController();
  for (const signal of signals) {
    if (!signal) continue;
    if (signal.aborted) {
      controller.abort(signal.reason);
      break;
    }
    signal.addEventListener("abort", () => controller.abort(signal.reason), { once: true });
  }
  return controller.signal;
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(abortError(signal));
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(abortError(signal));
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

function backoff(attempt, policy) {
  const ceiling = Math.min(policy.maxDelayMs, policy.initialDelayMs * 2 ** Math.max(0, attempt - 1));
  return Math.round(ceiling * (0.5 + Math.random() / 2)); // jitter: many tabs do not come back at once
}

function retryAfterMs(response) {
  const value = Number(response.headers.get("retry-after"));
  return Number.isFinite(value) && value > 0 ? Math.min(value, 60) * 1000 : 0;
}

// ------------------------------------------------------------------------------ the run stream

/**
 * The events of one run, joined across as many connections as it takes: an async generator of
 * {id, data, event} (event: the parsed JSON) that ends after RUN_FINISHED or RUN_ERROR.
 *
 * `state` ({threadId, runId, lastEventId}) is updated as events arrive; `state.session` is the
 * value of the run's CUSTOM iac-code.session.v1 event, `state.terminal` its terminal event.
 * `first` is an already open response (the run's own POST) and `repost` makes that request again
 * (used only while no response ever came back: the adapter treats the same body with
 * Last-Event-ID as the same run). Other reconnects use GET /threads/{t}/runs/{r}/events with
 * Last-Event-ID. Events whose id was already delivered are skipped, so the output is one run.
 * `emptyOk`: a 204 (nothing left to read) ends the generator quietly instead of failing it.
 */
export async function* runEvents(state, options) {
  const policy = { ...DEFAULT_RECONNECT, ...(options.reconnect || {}) };
  const fetchFn = options.fetch || defaultFetch;
  const signal = options.signal;
  let response = options.first || null;
  let answered = Boolean(response);
  let attempt = !response && options.repost ? 1 : 0; // a POST without answer was the first drop
  let lastError = null;
  let delayMs = 0;
  for (;;) {
    if (signal?.aborted) throw abortError(signal);
    if (!response) {
      if (attempt > policy.maxRetries) {
        throw lastError || new Error(`the stream of run ${state.runId} dropped and did not come back`);
      }
      if (attempt > 0) await sleep(Math.max(delayMs, backoff(attempt, policy)), signal);
      delayMs = 0;
      const reposting = !answered && Boolean(options.repost);
      try {
        if (reposting) {
          response = await options.repost();
        } else {
          const headers = { ...withoutHeaders(options.headers, ["content-type", "last-event-id"]), Accept: "text/event-stream" };
          if (state.lastEventId !== null && state.lastEventId !== undefined) headers["Last-Event-ID"] = String(state.lastEventId);
          response = await fetchFn(eventsUrl(options.baseUrl, state.threadId, state.runId).href, {
            method: "GET",
            headers,
            signal,
          });
        }
      } catch (error) {
        if (signal?.aborted) throw abortError(signal);
        lastError = error;
        attempt += 1;
        continue;
      }
      if (response.ok) answered = true; // the run exists: from now on, the events route
      options.onConnect?.(response);
      if (response.status === 204) {
        if (options.emptyOk || state.terminal) return;
        throw new AdapterHttpError(204, "the adapter has no more events for this run, and its terminal event was never read");
      }
      if (!response.ok) {
        // 409 to the POST sent again: the first one may still be being admitted (THREAD_BUSY
        // until the thread knows the run); once it does, the same POST reattaches
        if (RETRYABLE_STATUS.has(response.status) || (reposting && response.status === 409)) {
          delayMs = retryAfterMs(response);
          lastError = await httpError(response);
          response = null;
          attempt += 1;
          continue;
        }
        throw await httpError(response);
      }
      if (!isEventStream(response) || !response.body) {
        throw new AdapterHttpError(response.status, `not an event stream: ${response.headers.get("content-type")}`);
      }
    }
    // read this connection until its end, its failure, or the run's terminal event
    const reader = response.body.getReader();
    const decoder = new TextDecoder("utf-8");
    const parser = new SSEParser();
    let timer = null;
    let idled = null;
    const arm = () => {
      clearTimeout(timer);
      if (policy.idleTimeoutMs > 0) {
        timer = setTimeout(() => {
          idled = new Error(`no byte for ${policy.idleTimeoutMs} ms`);
          reader.cancel(idled).catch(() => {}); // the pending read ends: a drop like any other
        }, policy.idleTimeoutMs);
      }
    };
    try {
      arm();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        arm();
        for (const raw of parser.push(decoder.decode(value, { stream: true }))) {
          const id = raw.id !== null && /^\d+$/.test(raw.id) ? Number(raw.id) : null;
          if (id !== null && state.lastEventId !== null && state.lastEventId !== undefined && id <= state.lastEventId) {
            continue; // delivered already, by an earlier connection
          }
          let event = null;
          try {
            event = JSON.parse(raw.data);
          } catch {
            // not ours to judge: the agent's own parser reports it
          }
          if (id !== null) {
            state.lastEventId = id;
            attempt = 0; // progress: the retry budget is whole again
          }
          if (event?.type === "CUSTOM" && event.name === SESSION_EVENT && event.value) state.session = event.value;
          const terminal = TERMINAL.has(event?.type);
          if (terminal) state.terminal = event;
          yield { id, data: raw.data, event };
          if (terminal) return;
        }
      }
      lastError = idled || new Error(`the stream of run ${state.runId} ended before its terminal event`);
    } catch (error) {
      if (signal?.aborted) throw abortError(signal);
      lastError = error;
    } finally {
      clearTimeout(timer);
      reader.cancel().catch(() => {});
    }
    response = null;
    attempt += 1;
    options.onDrop?.(lastError, attempt);
  }
}

// ------------------------------------------------------------------------------ plain helpers

/** GET /threads/{threadId}: the thread's live run, pending interrupts, execution and recent runs. */
export async function getThread(baseUrl, threadId, { headers, fetch, signal } = {}) {
  const response = await (fetch || defaultFetch)(threadUrl(baseUrl, threadId).href, {
    method: "GET",
    headers: { ...withoutHeaders(headers, ["content-type", "accept", "last-event-id"]), Accept: "application/json" },
    signal,
  });
  if (!response.ok) throw await httpError(response);
  return response.json();
}

/**
 * Follow a run through the events route (from the event after `lastEventId`, or its first
 * event), reconnecting as needed. `onEvent(event, id)` sees every event once. Resolves with the
 * terminal event (RUN_FINISHED or RUN_ERROR), or null when the adapter answered 204 (the run
 * ended and nothing is left after `lastEventId`).
 */
export async function followRun(baseUrl, { threadId, runId, lastEventId = null, headers, signal, onEvent, fetch, reconnect } = {}) {
  const state = { threadId, runId, lastEventId, session: null, terminal: null };
  for await (const item of runEvents(state, { baseUrl, headers, signal, fetch, reconnect, emptyOk: true })) {
    await onEvent?.(item.event, item.id);
  }
  return state.terminal;
}

/** POST the cancel extension: {executionId, status: "cancelled" | "already_terminal"}. */
export async function cancelExecution(baseUrl, { executionId, threadId, rosInvocationId, headers, fetch, signal } = {}) {
  const url = new URL(`extensions/iac-code/v1/executions/${encodeURIComponent(executionId)}/cancel`, adapterBase(baseUrl));
  const response = await (fetch || defaultFetch)(url.href, {
    method: "POST",
    headers: {
      ...withoutHeaders(headers, ["content-type", "accept", "last-event-id"]),
      "Content-Type": "application/json",
      Accept: "application/json",
    },
    body: JSON.stringify({ threadId, rosInvocationId }),
    signal,
  });
  if (!response.ok) throw await httpError(response);
  return response.json();
}

// ------------------------------------------------------------------------------- the agent

function frame(item) {
  const id = item.id === null ? "" : `id: ${item.id}\n`;
  return `${id}${item.data
    .split("\n")
    .map((line) => `data: ${line}`)
    .join("\n")}\n\n`;
}

/** A Response whose body is the joined run, as the agent's own SSE parser expects it. */
function joinedResponse(state, options, template) {
  const encoder = new TextEncoder();
  const stop = new AbortController();
  const events = runEvents(state, { ...options, signal: anySignal([options.signal, stop.signal]) });
  const body = new ReadableStream({
    async pull(controller) {
      try {
        const { done, value } = await events.next();
        if (done) {
          state.live = false;
          controller.close();
        } else controller.enqueue(encoder.encode(frame(value)));
      } catch (error) {
        state.live = false;
        controller.error(error);
      }
    },
    cancel() {
      state.live = false;
      stop.abort(); // the agent let go (detach, unsubscribe): stop reading, no reconnect
    },
  });
  return new Response(body, {
    status: template?.status || 200,
    headers: { "Content-Type": "text/event-stream; charset=utf-8" },
  });
}

function emptyStream() {
  return new Response("", { status: 200, headers: { "Content-Type": "text/event-stream; charset=utf-8" } });
}

/**
 * A subclass of `HttpAgentClass` (@ag-ui/client's HttpAgent or a subclass of it) that speaks to
 * agui-adapter: reconnect with Last-Event-ID, connect() reattaches, abortRun() cancels.
 *
 * Extra config keys: `reconnect` (see DEFAULT_RECONNECT; `{maxRetries: 0}` turns reconnecting
 * off), `cancelOnAbort` (default true). `agent.lastRun` is {threadId, runId, lastEventId,
 * session, terminal} of the latest stream; `agent.connectAgent({runId})` attaches to that run.
 */
export function withAdapter(HttpAgentClass) {
  return class AdapterHttpAgent extends HttpAgentClass {
    constructor(config = {}) {
      super(config);
      this.reconnect = { ...DEFAULT_RECONNECT, ...(config.reconnect || {}) };
      this.cancelOnAbort = config.cancelOnAbort !== false;
      this.lastRun = null;
      this.pendingCancel = null;
      this.adoptFetch(this.fetch);
    }

    /** Route the agent's requests through the reconnecting stream (`fetch`: the transport). */
    adoptFetch(fetchFn) {
      this.transportFetch = fetchFn;
      this.fetch = (url, init) => this.adapterFetch(url, init);
    }

    clone() {
      const copy = super.clone();
      copy.reconnect = { ...this.reconnect };
      copy.cancelOnAbort = this.cancelOnAbort;
      copy.lastRun = null;
      copy.pendingCancel = null;
      copy.adoptFetch(this.transportFetch);
      return copy;
    }

    /** The adapter's root URL (the agent's url is the run endpoint, POST /). */
    get adapterUrl() {
      return adapterBase(this.url).href;
    }

    run(input) {
      this.plan = { kind: "run" };
      return super.run(input);
    }

    connect(input) {
      this.plan = { kind: "connect", attachTo: this.connectRunId ?? null };
      this.connectRunId = null;
      return super.run(input); // HttpAgent.run, for its parser; adapterFetch reads the plan and GETs the events route
    }

    requestInit(input) {
      const init = super.requestInit(input);
      const plan = this.plan || { kind: "run" };
      this.plan = null;
      return { ...init, [PLAN]: { ...plan, threadId: input.threadId, runId: input.runId } };
    }

    async runAgent(parameters, subscriber) {
      await this.settleCancel();
      return super.runAgent(parameters, subscriber);
    }

    async connectAgent(parameters, subscriber) {
      await this.settleCancel();
      // HttpAgent sets a fresh AbortController in runAgent only; a connect needs one too
      this.abortController = parameters?.abortController ?? new AbortController();
      this.connectRunId = parameters?.runId ?? null;
      return super.connectAgent(parameters, subscriber);
    }

    abortRun() {
      const run = this.lastRun;
      if (this.cancelOnAbort && run && run.live && !run.terminal) {
        run.live = false;
        // sent before the connection closes, on its own request: the thread is free at once
        this.pendingCancel = this.cancelRun(run)
          .catch(() => null)
          .finally(() => {
            this.pendingCancel = null;
          });
      }
      super.abortRun();
    }

    /** Wait (at most 5 s) for the cancel an abortRun() sent, so the next turn finds the thread free. */
    async settleCancel() {
      if (!this.pendingCancel) return;
      const patience = new AbortController();
      await Promise.race([this.pendingCancel, sleep(5000, patience.signal).catch(() => {})]);
      patience.abort(); // no timer left behind (a Node process would wait for it)
    }

    async cancelRun(run) {
      let session = run.session;
      if (!session) {
        // aborted before the session event: ask the thread what its execution is
        const thread = await getThread(this.adapterUrl, run.threadId, { headers: this.headers, fetch: this.transportFetch });
        if (thread?.activeRun?.runId !== run.runId || !thread.execution) return null;
        session = thread.execution;
      }
      return cancelExecution(this.adapterUrl, {
        executionId: session.executionId,
        threadId: run.threadId,
        rosInvocationId: session.rosInvocationId,
        headers: this.headers,
        fetch: this.transportFetch,
      });
    }

    /** Which run connect() should attach to: the thread's live run, else the one this agent remembers. */
    async liveRunId(threadId, explicit) {
      if (explicit) return explicit;
      try {
        const thread = await getThread(this.adapterUrl, threadId, { headers: this.headers, fetch: this.transportFetch });
        return thread?.activeRun?.runId ?? null;
      } catch (error) {
        // an adapter without GET /threads/{id} (404 NOT_FOUND): fall back on what we remember
        if (!(error instanceof AdapterHttpError) || error.status !== 404 || error.code === "THREAD_NOT_FOUND") throw error;
      }
      const last = this.lastRun;
      return last && last.threadId === threadId && !last.terminal ? last.runId : null;
    }

    async adapterFetch(url, init) {
      const plan = init?.[PLAN];
      if (!plan) return this.transportFetch(url, init);
      const request = { ...init };
      delete request[PLAN];
      const options = {
        baseUrl: adapterBase(url).href,
        headers: request.headers,
        fetch: this.transportFetch,
        signal: request.signal,
        reconnect: this.reconnect,
      };
      const state = { threadId: plan.threadId, runId: plan.runId, lastEventId: null, session: null, terminal: null, live: true };
      if (plan.kind === "connect") {
        const runId = await this.liveRunId(plan.threadId, plan.attachTo);
        if (!runId) return emptyStream(); // nothing live on the thread: connectAgent() ends at once
        state.runId = runId;
        this.lastRun = state;
        return joinedResponse(state, { ...options, emptyOk: true }, null);
      }
      this.lastRun = state;
      const repost = () => {
        const headers = { ...plainHeaders(request.headers), "Last-Event-ID": "0" };
        return this.transportFetch(url, { ...request, headers });
      };
      let first;
      try {
        first = await this.transportFetch(url, request);
      } catch (error) {
        if (request.signal?.aborted || this.reconnect.maxRetries <= 0) throw error;
        first = null; // no answer at all: the stream retries the same POST (same run, same body)
      }
      if (first && (!first.ok || !isEventStream(first) || !first.body)) {
        state.live = false;
        return first; // a JSON error before the stream: the agent reports it as usual
      }
      return joinedResponse(state, { ...options, first, repost }, first);
    }
  };
}
