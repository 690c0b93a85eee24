"""What keeps the queue healthy: the reaper (expired leases, pruning, periodic jobs) and vacuum.

Rule: Imports ``core``, ``tasks`` and ``store``.
"""
