"""Local-model management: manifests and the model cache (`models`), requantized variants,
tuning, the OpenMP wait policy, fingerprints, llama settings, and `loader`, the one place that
loads llama.cpp."""
