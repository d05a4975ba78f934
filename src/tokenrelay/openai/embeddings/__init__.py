"""`POST /v1/embeddings`: a FastAPI route (see `router`), served by the model's backend."""
