"""Regenerate docs/configuration.md from objcache.Config: ``python -m objcache.docgen``."""

from objcache.config import reference_markdown

if __name__ == "__main__":
    print(reference_markdown(), end="")
