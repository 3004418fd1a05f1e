"""Model services: a model behind an HTTP server that speaks the OpenAI API, usable where a local
model is for `generate` and `chat`, and for `evaluate` on llama.cpp's server. The tests run them
against llama.cpp's real server; other servers of the same API (Ollama, vLLM, hosted APIs) are
not tested here."""
