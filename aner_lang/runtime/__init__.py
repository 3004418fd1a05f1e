"""The native backend: GGUF I/O, tokenizer, the torch Llama model, generation, data, evaluation.

Only builtin implementations import this package (lazily), so the front end starts without torch.
"""
