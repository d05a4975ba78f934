"""API keys: secrets and their hashes, the key store, verification with a short cache, the /v1 guard."""
