"""What a model is used for besides training: datasets and batches (`data`), text generation
(`generate`) and held-out evaluation (`evaluate`)."""
