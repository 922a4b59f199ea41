# Logs every Triton compile (name, source hash, constants, cache hit) to $DIAG_TRITON_LOG:
# a diagnostic for scripts/gpu_autotune_diag/run.py, never installed anywhere.
import json
import os

_path = os.environ.get("DIAG_TRITON_LOG")
if _path:
    try:
        from triton import knobs

        def _listener(*, src, metadata, metadata_group, times, cache_hit):
            try:
                fn = getattr(src, "fn", None)
                rec = {
                    "name": metadata.get("name"),
                    "hash": metadata.get("hash"),
                    "hit": cache_hit,
                    "fn_key": getattr(fn, "cache_key", None),
                    "src_hash": src.hash() if hasattr(src, "hash") else None,
                    "constants": repr(getattr(src, "constants", None))[:800],
                    "signature": repr(getattr(src, "signature", None))[:800],
                    "attrs": repr(getattr(src, "attrs", None))[:300],
                    "fn_src": "" if cache_hit else (getattr(fn, "src", "") or "")[:30000],
                    "fn_name": getattr(fn, "__name__", None),
                    "mod": getattr(getattr(fn, "fn", None), "__module__", None),
                }
                with open(_path, "a") as f:
                    f.write(json.dumps(rec, default=str) + "\n")
            except Exception as e:
                with open(_path, "a") as f:
                    f.write(json.dumps({"error": repr(e)}) + "\n")

        knobs.compilation.listener = _listener
    except Exception:
        pass
