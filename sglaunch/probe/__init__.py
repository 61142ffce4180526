"""Read the machine and the checkpoint without importing torch: packages, GPUs, config.json, safetensors headers."""
