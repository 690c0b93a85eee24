"""Claiming and running jobs: the claim loop, dispatch to threads and the event loop, outcomes,
heartbeat, notifications, prefetch.

Rule: Imports ``core``, ``tasks``, ``store`` and ``observability``; never the client or the
supervisor.
"""
