// Starts `aner lsp` (configurable: aner.server.command) for .aner files over stdio.
const vscode = require("vscode");
const { LanguageClient, TransportKind } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const [command, ...args] = vscode.workspace.getConfiguration("aner").get("server.command");
  client = new LanguageClient(
    "aner",
    "Aner language server",
    { command, args, transport: TransportKind.stdio },
    { documentSelector: [{ scheme: "file", language: "aner" }, { scheme: "untitled", language: "aner" }] },
  );
  context.subscriptions.push(client);
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
