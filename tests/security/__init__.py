"""The threat model in one place: each module is one kind of hostile neighbour or object
(docs/security.md lists every guarantee with the test that proves it)."""
