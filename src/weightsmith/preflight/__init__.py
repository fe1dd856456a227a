"""`weightsmith preflight`: what an installed vLLM will do with a (target, draft) pair, read from its source."""
