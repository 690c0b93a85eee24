"""What an app declares: :class:`App` and its tasks, the :class:`Job` a handler receives, periodic
schedules.

Rule: Imports ``core`` only.
"""
