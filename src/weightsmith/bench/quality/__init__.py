"""Quality A/B: task scenarios sent through the server, checked, and compared between arms."""
