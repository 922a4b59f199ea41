"""The threat model in one place: each module is one kind of hostile neighbour or object
(docs/security.md lists every guarantee with the test that proves it).

- ``test_stores_and_keys``: a writer to a remote store without a key (planted pickles, hostile
  object and user keys, oversized keys), secrets in URLs, logs and output, the stats file.
- ``test_signing_and_trust``: signatures (Ed25519 and HMAC), entries bound to their key, size
  caps and zstd bombs, keys that fail to mount, the read-only fleet.
- ``test_local_dir``: other users and group members on the node (umask 002, a planted local
  dir or symlink, leases through the store's own folder walk).
- ``test_records_hostile``: mutable records (PGO profiles): held locks, oversized or
  undecodable records, poisoned keys replaced by the next writer.
- ``test_terminal_and_bulk``: strings from a store on the operator's terminal, the Prometheus
  textfile in a shared folder, caps on bulk ``pull``/``push``/``verify``.
"""
