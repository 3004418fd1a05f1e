"""What a model is used for besides training: datasets, batches and losses (`data`, with the
dataset operations in `dataset_ops` and chat rendering in `chat`), text generation (`generate`),
held-out evaluation (`evaluate`) and its figures (`scores`, shared with model services)."""
