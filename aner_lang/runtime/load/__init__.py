"""Loading a model file into a `LoadedModel` with a chosen storage on a chosen device.

Sits above `nf4/` because a load converts each weight to its target storage (NF4 included)."""
