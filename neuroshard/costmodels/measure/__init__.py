"""Measure real costs: fused embedding kernels and all-to-all communication."""
