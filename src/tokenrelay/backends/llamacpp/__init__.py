"""The embedded llama.cpp engine: GGUF models in-process through llama-cpp-python's low-level API."""
