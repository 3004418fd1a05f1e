"""Aner: a typed scripting language for adapting language models.

Importing this package is cheap and never imports torch: the parser (`aner_lang.grammar`), the
checker (`aner_lang.check`) and the registry (`aner_lang.builtins`) are pure Python; the native
runtime (`aner_lang.runtime`) is imported only when a native builtin is first called.
"""

__version__ = "0.1.0"
