"""Search sharding plans against cost models."""
