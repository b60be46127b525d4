"""rtrain.cli: the `rtrain` command. Parses, calls the agent, renders; holds no logic."""
