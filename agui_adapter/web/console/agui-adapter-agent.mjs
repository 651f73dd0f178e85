// agui-adapter-agent.mjs: @ag-ui/client's HttpAgent, made to speak to agui-adapter (for bundlers and Node).
//
// Why a second module: agui-adapter-client.mjs has no dependency, so it cannot name HttpAgent
// itself; this one does, for code that resolves "@ag-ui/client" (a bundler, Node, or a browser
// with an import map). What the subclass adds is described in agui-adapter-client.mjs.
import { HttpAgent } from "@ag-ui/client";
import { withAdapter } from "./agui-adapter-client.mjs";

export * from "./agui-adapter-client.mjs";

export class AdapterHttpAgent extends withAdapter(HttpAgent) {}
