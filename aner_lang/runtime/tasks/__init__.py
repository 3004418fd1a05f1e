"""What a model is used for besides training: datasets as text (`records`, no torch), batches
and losses (`data`), text generation (`generate`) and held-out evaluation (`evaluate`)."""
