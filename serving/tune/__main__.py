"""``python -m serving.tune``: see ``serving.tune``."""

from serving.tune.cli import main

if __name__ == "__main__":
    main()
