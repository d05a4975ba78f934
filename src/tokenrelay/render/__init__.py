"""Backend events → OpenAI response bodies and stream chunks."""
