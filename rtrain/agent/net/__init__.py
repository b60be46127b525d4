"""What the agent's servers share: caps on connections, and refusal logs that stay quiet."""
