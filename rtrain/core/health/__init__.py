"""GPU health as pure verdicts: NVML readings and XID codes in, a verdict and an
action out; which GPUs a node should have."""
