"""``v1/<env>/ENV.json``: the environment's fingerprint fields in readable form, so humans can
read a bucket (docs/architecture.md, "Environments"). Written once per process
that writes a lookup's entry to a remote tier, raw JSON (not an entry), in CREATE mode."""

from __future__ import annotations

import json


class EnvNote:
    """The fingerprint fields of one cache's environment, and whether they were written."""

    def __init__(self, fields: dict[str, str] | None) -> None:
        self._fields = fields
        self._taken = False

    @property
    def fields(self) -> dict[str, str]:
        """The fingerprint fields (empty when not given)."""
        return dict(self._fields or {})

    def take(self) -> bytes | None:
        """The body of ``ENV.json`` the first time; None after that or without fields."""
        if self._taken or self._fields is None:
            return None
        self._taken = True
        return json.dumps(self._fields, indent=1, sort_keys=True).encode()
