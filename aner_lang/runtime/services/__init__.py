"""Model services: a model behind an OpenAI-compatible HTTP server (llama.cpp's server, Ollama,
vLLM, hosted APIs), usable where a local model is for `generate`, `chat` and `evaluate`."""
