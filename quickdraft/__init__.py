"""quickdraft: lossless speculative decoding."""
