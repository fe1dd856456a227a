"""A/B serving benchmarks against OpenAI-compatible servers (vLLM, llama.cpp's llama-server).

The pieces, in the order a run uses them: `config` reads the arms file, `schedule` orders the
visits, `servers` starts and stops each arm, `workloads` cuts the prompts, `client` streams one
request, `metrics` reads speculative-decoding counters from /metrics, `runner` drives it all,
`stats` and `determinism` analyse, `logcheck` reads the server logs, and `report`/`plots` write
what a reader sees. `results` holds the typed, versioned record that ties them together.
"""
