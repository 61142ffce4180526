"""sglaunch: an SGLang-compatible launch server (flag migration, config checks, DSpark serving).

Importing this package is cheap on purpose: nothing here imports torch.
"""

__version__ = "0.1.0"

# The SGLang release whose launch surface `serve` implements.
SGLANG_RELEASE = "0.5.16"
