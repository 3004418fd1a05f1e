"""GGUF bases kept as the file's own quantized blocks (`storage: gguf`): one tensor's blocks
(`weight`, decoded by `io.ggml_blocks`), the frozen module over them with its tiled matmul
(`linear`) and the CUDA kernels of the fused path (`fused`)."""
