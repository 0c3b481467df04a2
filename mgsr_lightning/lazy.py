"""A package's names imported on first use (PEP 562), so importing the package loads none of their modules.

A package lists each exported name's module and binds the two module-level hooks this returns::

    _HOMES = {"DistillLightningModule": "mgsr_lightning.module"}
    __getattr__, __dir__ = lazy_exports(globals(), _HOMES)

The first ``package.Name`` (or ``from package import Name``) imports ``Name``'s module and keeps the value
in the package's namespace, so later lookups do not come back here. ``dir(package)`` lists the names of
``__all__`` before they are loaded. Only the standard library is imported here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

Hooks = tuple[Callable[[str], Any], Callable[[], list[str]]]


def lazy_exports(namespace: dict[str, Any], homes: Mapping[str, str]) -> Hooks:
    """(``__getattr__``, ``__dir__``) for the package whose ``globals()`` is ``namespace``; ``homes`` maps
    each lazily imported name to the dotted module that defines it."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(homes[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *namespace.get("__all__", ())})

    return __getattr__, __dir__
