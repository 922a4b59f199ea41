"""objcache."""
