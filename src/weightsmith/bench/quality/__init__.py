"""Quality A/B through the server: scenarios, their checks, and verdicts read against each arm's own noise."""
