"""No models: miniqueue's tables are its own migrations' (see :mod:`.apps`). The module exists
because Django sends ``pre_migrate`` only to apps that have one."""
