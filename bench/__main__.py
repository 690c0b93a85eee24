"""``python -m bench``: see :mod:`bench.cli`."""

from bench.cli import main

if __name__ == "__main__":  # spawned worker processes re-import this module; they must not run main()
    main()
