"""The one installer of every integration: torch's, Triton's and vLLM's parts applied alike.

``hooks`` installs and uninstalls (routing torch's remote caches through objcache and
applying the other parts), ``features`` says which parts this torch carries, ``watched`` is
the one list of the modules a part is applied on, ``autoload`` the zero-code path behind
``objcache-autoload.pth`` and ``zero_code_switch`` its switch. What it changes is recorded
in the one ledger, :mod:`objcache.integrations.patching`, to put back exactly."""
