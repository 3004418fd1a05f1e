// Starts `aner lsp` (or the command in the `aner.server.command` setting) over stdio for .aner files.
const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const [command, ...args] = vscode.workspace.getConfiguration("aner").get("server.command", ["aner", "lsp"]);
  client = new LanguageClient(
    "aner",
    "Aner language server",
    { command, args },
    { documentSelector: [{ scheme: "file", language: "aner" }, { scheme: "untitled", language: "aner" }] },
  );
  context.subscriptions.push(client);
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
