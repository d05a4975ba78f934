"""The published OpenAPI document: built from the routes and the pydantic models that validate their bodies."""
