"""`sglaunch bench`: load generator and report for OpenAI-compatible endpoints (ours, SGLang, vLLM).

workload (what to send) -> client (one streamed request, timed) -> runner (a level: closed-loop
concurrency or open-loop Poisson rate) -> stats (per-level metrics, server-side DSpark statistics)
-> sweep (configurations x levels, interleaved) -> report / plot (table, JSON, PNG).
Nothing here imports torch; httpx, rich and matplotlib are imported by the modules that need them.
"""
