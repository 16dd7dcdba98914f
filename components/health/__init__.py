"""Health (issue 33): the watchdog on the head and an agent on every other node, as pure container
specs and their config (`containers`); the programs are `components/node_programs/watchdog.py` and
`health_agent.py`, their shared constants `health_wire`."""
