"""The chaos harness: a real ``miniqueue-supervise`` on a real database, under fire.

``python -m chaos`` enqueues jobs, injects faults while they drain (SIGKILL of workers, the
reaper and the supervisor, SIGSTOP past the lease, ``pg_terminate_backend``, PostgreSQL
restarts, a second supervisor, a snapshot held open; over several databases, a stopped server),
then checks from the databases' own records that no job was lost or completed twice and that
every re-execution is explained by a fault it injected. ``--everything`` runs every mode at once
and writes a Markdown report. See ``chaos/README.md``.
"""
