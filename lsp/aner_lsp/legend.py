"""The semantic-token legend, kept free of parser imports so the server can register it at start-up."""

TOKEN_TYPES = [
    "keyword",
    "string",
    "number",
    "comment",
    "function",
    "variable",
    "parameter",
    "type",
    "enum",
    "enumMember",
    "property",
    "operator",
]
TOKEN_MODIFIERS = ["declaration", "defaultLibrary"]
