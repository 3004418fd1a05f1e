"""Bytes in and out: GGUF reading (`gguf`), base-model fingerprints, packaged model files, and
host copies of device tensors. Nothing here knows what a transformer is."""
