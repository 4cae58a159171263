"""GGUF files edited and fuzzed for the loader's tests."""
