"""Model loading (registry, local directories, GGUF files) and runners."""
