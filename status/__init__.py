"""`python -m status`: the operator's view of a stack, from the operator's machine (a runtime of its own).

It reads `Pulumi.<stack>.yaml` with the program's own loader and validation, needs neither the Pulumi
CLI nor the stack's state, asks every node in parallel over the program's SSH transport (one round
trip each: `components/node_programs/node_status.py`), asks the server what a client would, and
judges all of it against the declaration. `gather.py` gathers (SSH, HTTP, the stack outputs: the
I/O), `verdict.py` judges (pure: `judge` assembles what `node_cells.py`, `fabric.py`, `serving.py`,
`watchdog.py` and `checks.py` judge, each a job), `render.py` prints.
"""
