"""The kinds objcache stores, gathered from where they are named: the central list
(``objcache.entry.layout.KINDS``), the constants of the modules that write them, and every
module-level ``*KIND*`` string constant or mapping of kinds in objcache/ (read with :mod:`ast`),
so a kind added anywhere is found without this file being told."""

from __future__ import annotations

import ast

from tests.support.paths import ROOT

#: ``*KIND*`` constants that name no stored kind: a portable guard record's kind of source.
NOT_STORED = {
    "COMPILE_SETTINGS",
    "CLASS_LAYOUT",
    "ABSENT_NAMES",
    "ABSENT_KEYS",
    "PRESENT_KEYS",
    "MODULE_HOOKS",
    "GLOBAL_HOOKS",
    "INLINED_CODE",
    "SET_ORDER",
    "UNGUARDED_VALUE",
    "ALIASES",
    "ABC_MEMBERSHIP",
}


def written_kinds() -> set[str]:
    """The kinds named by the constants of the modules that write them."""
    from objcache.core import manifest
    from objcache.integrations import triton, triton_host, vllm, vllm_aot
    from objcache.integrations.install import features
    from objcache.integrations.torch.kernels import kernel_places, kernels
    from objcache.integrations.torch.mega import mega
    from objcache.integrations.torch.precompile import precompile_entry
    from objcache.observe import keycards
    from objcache.observe import run_summary as summary

    written = {manifest.KIND, mega.KIND, summary.KIND, triton.KIND, kernels.KIND}
    written |= {kernels.VERDICT_KIND, kernel_places.KIND, precompile_entry.KIND, triton_host.KIND}
    written |= {vllm.KIND_MODELINFO, vllm_aot.KIND, keycards.MISSES_KIND}
    return written | set(keycards.CARD_KIND.values()) | set(features.PART_OF_KIND)


def _strings(node: ast.expr, keys: bool) -> set[str]:
    """The strings of a constant; of a mapping, its keys (``keys``) or its values."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Dict):
        side = node.keys if keys else node.values
        return {s for v in side if v is not None for s in _strings(v, keys)}
    if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
        return {s for e in node.elts for s in _strings(e, keys)}
    if isinstance(node, ast.Call) and node.args:  # frozenset({...})
        return _strings(node.args[0], keys)
    return set()


def named_kinds() -> set[str]:
    """Every kind named by a module-level constant whose name has ``KIND`` in it, in
    objcache/ and the backends: a kind, a set of kinds, a mapping to kinds (``CARD_KIND``)
    or, named ``*_OF_KIND``, from kinds (``PART_OF_KIND``)."""
    found: set[str] = set()
    for root in (ROOT / "objcache", ROOT / "backends" / "objcache" / "backends"):
        for path in root.rglob("*.py"):
            for node in ast.parse(path.read_text()).body:
                target: ast.expr | None = None
                if isinstance(node, ast.AnnAssign):
                    target = node.target
                elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target = node.targets[0]
                value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
                if isinstance(target, ast.Name) and "KIND" in target.id and value is not None:
                    found |= _strings(value, keys="OF_KIND" in target.id)
    return found - NOT_STORED


def all_kinds() -> set[str]:
    from objcache.entry.layout import KINDS

    return set(KINDS) | written_kinds() | named_kinds()
