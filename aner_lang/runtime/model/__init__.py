"""The model: hyper-parameters (`config`), the decoder in torch (`transformer`), frozen weight
matrices (`linear`), the tokenizer and chat template (`tokenizer`), compute dtypes (`precision`)
and `LoadedModel`, what an Aner `Model` value is."""
