"""What a stored entry is and what it is called: the entry format (``codec``), its Ed25519
signatures and HMAC keys (``signing``, ``hmac_keys``), object keys ``v1/<env>/<kind>/...``
(``layout``) and per-kind size caps (``caps``). Pure functions over bytes and names: it may
import only ``objcache.errors`` (docs/architecture.md, "Layers")."""
