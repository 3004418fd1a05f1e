"""The Aner language server: pure feature functions over an analysis snapshot (`features`,
`cursor`, `positions`, `lexer`) and the pygls wiring (`server`). Never imports torch or cupy."""

__version__ = "0.1.0"
