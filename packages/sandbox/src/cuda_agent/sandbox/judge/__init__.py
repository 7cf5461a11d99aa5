"""The judge out of the candidate's reach: two processes per job.

A verification or profiling job runs in an executor worker, the *trusted* process: it copies
the files it judges (:mod:`.snapshot`), runs the static checks, imports the reference, draws
every input, runs the reference, compares every output and decides. The candidate's code
runs only in the *candidate* process (:mod:`.candidate`), started by the trusted one under
a user id of the job's own in a PID namespace of its own (:mod:`.identity`), and driven over
a socket that carries JSON only (:mod:`.wire`, :mod:`.client`, :mod:`.session`). Outputs
come back as sealed memory files or CUDA IPC handles (:mod:`.tensors`, :mod:`.cuda_ipc`)
and are copied before they are read. Timing runs in compiled code (:mod:`.native`), and the
trusted side checks what comes back against its own wall clock and against checksums of
timed calls it recomputes (:mod:`.timing`, :mod:`.rotation`).

Around the two processes: :mod:`.verify` (the verdict's steps, with :mod:`.options`,
:mod:`.loading`, :mod:`.comparison`, :mod:`.draws`, :mod:`.poisoning` and
:mod:`.watchdog`), :mod:`.jobs` and :mod:`.tasks` (the job functions executors run),
:mod:`.baselines` (eager and torch.compile times, cached), :mod:`.profilers` (profiler
plugins), :mod:`.checks` (static checks on the sources), :mod:`.op_guard` (torch operators
refused while ``ModelNew.forward`` runs), :mod:`.integrity`, :mod:`.inputs`,
:mod:`.precision` and :mod:`.rules` (rule profiles).

May import: ``cuda_agent.core``, :mod:`..executors` (job errors), :mod:`..compilers` and
:mod:`..isolation`; never :mod:`..workspace`.
"""
