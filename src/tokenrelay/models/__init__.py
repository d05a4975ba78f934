"""Model files: GGUF headers read without loading, and GGUFs pulled from the Hugging Face Hub."""
