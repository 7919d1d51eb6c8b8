"""Lazy re-exports for package `__init__` modules.

`import art` costs ~20 s (it imports torch), and the CLI must reject a bad key before paying
that, so packages name their public objects here and import them on first use.
"""

import importlib
from collections.abc import Callable


def lazy_exports(
    package: str, exports: dict[str, str]
) -> tuple[list[str], Callable[[str], object], Callable[[], list[str]]]:
    """(`__all__`, `__getattr__`, `__dir__`) for `package`, resolving name -> module lazily."""
    names = sorted(exports)

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    def __dir__() -> list[str]:
        return names

    return names, __getattr__, __dir__
