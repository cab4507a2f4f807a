"""tools/gpu_check.py's parts, one module per job (the command line is tools/gpu_check.py).

- ``common``: the repository's root, the children's environment, text and file helpers
- ``machine``: what the machine is (probe) and what it is doing (state readings)
- ``plan``: what to run, how long each item is expected to take, the streams, the schedule
  and its simulation (``--plan``), carrying over an earlier run (``--resume``)
- ``run``: running commands and items, and the scheduler (parallel streams, the timing phase)
- ``report``: the summary in Markdown
"""
