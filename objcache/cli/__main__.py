"""``python -m objcache.cli``: the ``objcache`` command."""

from objcache.cli.main import main

main()
