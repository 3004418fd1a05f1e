"""Writing trained models where other tools read them (GGUF for llama.cpp and transformers)."""
