"""End-to-end tests: taskgate against a misbehaving mock gateway, on every backend."""
