"""Test harness: real servers on 127.0.0.1 (Redis, SeaweedFS, moto, fake-gcs-server) and a
fault-injecting TCP proxy. Used by tests/ and bench/; not shipped with objcache."""
