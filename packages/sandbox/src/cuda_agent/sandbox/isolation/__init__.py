"""Isolation: where the agent's code runs and with what rights.

* :mod:`.sandboxes` -- the sandbox plugins for the agent's shell (``local``: a user of its own,
  namespaces and limits; ``docker``: a container from a locally built image), the disk file
  system that caps what a sandbox may write, and the sweep of a user's processes;
* :mod:`.privdrop` -- giving up root rights in a job process before candidate code runs;
* :mod:`.hostlock` -- host-wide quiet locks that keep timed sections apart from what disturbs them.

May import: ``cuda_agent.core`` only (the bottom of the sandbox package).
"""
