// CopilotKit's runtime in front of agui-adapter: the v2 single-route endpoint a CopilotKit
// React front end talks to, with the adapter as its one agent ("default").
//
//   npm install && AGUI_ADAPTER_URL=http://127.0.0.1:8000/ node server.mjs
//
// Env: AGUI_ADAPTER_URL (the adapter's POST / route), AGUI_ADAPTER_TOKEN (its bearer token, if
// it has one), PORT (4000; 0 picks a free one), HOST (127.0.0.1), COPILOTKIT_PATH
// (/api/copilotkit), AGUI_ADAPTER_CLIENT_MODULE (optional: the adapter's dependency-free
// agui-adapter-client.mjs, saved from GET /agui-adapter-client.mjs; with it the agent
// reconnects to a dropped run and cancels the kernel task on Stop at once).
import { createServer } from "node:http";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { HttpAgent } from "@ag-ui/client";
import { CopilotRuntime, createCopilotRuntimeHandler } from "@copilotkit/runtime/v2";
import { createCopilotNodeHandler } from "@copilotkit/runtime/v2/node";

const adapterUrl = process.env.AGUI_ADAPTER_URL ?? "http://127.0.0.1:8000/";
const basePath = process.env.COPILOTKIT_PATH ?? "/api/copilotkit";
const token = process.env.AGUI_ADAPTER_TOKEN;

let Agent = HttpAgent;
if (process.env.AGUI_ADAPTER_CLIENT_MODULE) {
  const module = pathToFileURL(resolve(process.env.AGUI_ADAPTER_CLIENT_MODULE)).href;
  const { withAdapter } = await import(module);
  Agent = withAdapter(HttpAgent); // what agui-adapter-agent.mjs exports as AdapterHttpAgent
}

const runtime = new CopilotRuntime({
  agents: {
    default: new Agent({ url: adapterUrl, headers: token ? { Authorization: `Bearer ${token}` } : {} }),
  },
});
const handler = createCopilotNodeHandler(createCopilotRuntimeHandler({ runtime, basePath, mode: "single-route" }));

const server = createServer(handler);
server.listen(Number(process.env.PORT ?? 4000), process.env.HOST ?? "127.0.0.1", () => {
  const { address, port } = server.address();
  console.log(`CopilotKit runtime on http://${address}:${port}${basePath} -> agui-adapter ${adapterUrl}`);
});
for (const signal of ["SIGINT", "SIGTERM"]) {
  process.on(signal, () => {
    server.close(() => process.exit(0));
    server.closeAllConnections(); // open streams too; on exit the adapter sees its runs disconnect
  });
}
