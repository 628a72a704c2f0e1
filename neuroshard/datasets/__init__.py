"""Datasets: tables from dlrm_datasets tensors, a calibrated synthetic benchmark,
augmentation and sharding tasks."""
