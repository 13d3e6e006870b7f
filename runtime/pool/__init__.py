"""The model pool: loaded models, leases, waiters and memory room."""
