"""A DLRM training runtime on torch.distributed that executes a plan and measures it."""
