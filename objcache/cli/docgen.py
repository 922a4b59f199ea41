"""Regenerate docs/configuration.md from objcache.Config: ``python -m objcache.cli.docgen``."""

from objcache.config.reference import reference_markdown

if __name__ == "__main__":
    print(reference_markdown(), end="")
