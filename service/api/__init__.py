"""The REST API under /api (routes in `routes/`, shared dependencies in `deps`)."""
