"""GGUF bases kept as the file's own quantized blocks (`storage: gguf`): the block formats
dequantized in torch (`blocks`), one tensor's blocks (`weight`) and the frozen module over them
with its tiled matmul (`linear`)."""
