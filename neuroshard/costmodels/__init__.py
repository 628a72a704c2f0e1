"""Cost models: measurement, neural compute/communication models, checkpoints."""
