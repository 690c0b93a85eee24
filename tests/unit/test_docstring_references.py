"""Every dotted reference in the package's docstrings resolves: a role (``:class:`~miniqueue.Client```,
``:meth:`Worker.run```) or a name in double backquotes that starts with ``miniqueue.``. A module
moved or renamed fails here, naming the docstring that still points at its old place."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import miniqueue

#: A Sphinx role's target, ``~`` and all.
_ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj):`~?([A-Za-z_][\w.]*)`")
#: A name of the package in double backquotes: ``miniqueue.store.claim``.
_QUOTED = re.compile(r"``(miniqueue(?:\.[A-Za-z_]\w*)+)``")


def modules() -> Iterator[ModuleType]:
    yield miniqueue
    for info in pkgutil.walk_packages(miniqueue.__path__, "miniqueue."):
        if info.name.endswith(".__main__") or info.name.startswith("miniqueue.integrations.django."):
            continue  # a command's entry (it runs); Django's app modules (they read its settings)
        yield importlib.import_module(info.name)


def documented(module: ModuleType) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(where, docstring, namespace)`` of the module and everything defined in it."""
    namespace = vars(module)
    if module.__doc__:
        yield module.__name__, module.__doc__, namespace
    for name, value in list(namespace.items()):
        if getattr(value, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(value):
            if value.__doc__:
                yield f"{module.__name__}.{name}", value.__doc__, {**namespace, **vars(value)}
            for member_name, member in vars(value).items():
                target = member.fget if isinstance(member, property) else member
                doc = getattr(target, "__doc__", None) if callable(target) or isinstance(member, property) else None
                if doc and getattr(target, "__module__", None) == module.__name__:
                    yield f"{module.__name__}.{name}.{member_name}", doc, {**namespace, **vars(value)}
        elif inspect.isfunction(value) and value.__doc__:
            yield f"{module.__name__}.{name}", value.__doc__, namespace


def resolves(target: str, namespace: dict[str, Any]) -> bool:
    """Whether ``target`` names something: from the package down, or from the docstring's own
    module (and class) namespace, the way a Sphinx role's relative name reads."""
    parts = target.split(".")
    if parts[0] == "miniqueue" or (parts[0] not in namespace and not hasattr(miniqueue, parts[0])):
        for cut in range(len(parts), 0, -1):
            try:
                found: Any = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            return _walk(found, parts[cut:])
        return False
    if parts[0] in namespace:
        return _walk(namespace[parts[0]], parts[1:])
    if hasattr(miniqueue, parts[0]):  # a public name (``Job.transaction``), as the reference reads it
        return _walk(getattr(miniqueue, parts[0]), parts[1:])
    return len(parts) == 1  # a bare name (``run``) reads as "this object's": not checked here


def _walk(found: Any, rest: list[str]) -> bool:
    for part in rest:
        if hasattr(found, part):
            found = getattr(found, part)
        elif part in getattr(found, "__annotations__", {}) or part in getattr(found, "__dataclass_fields__", {}):
            return True  # a field declared without a default
        elif inspect.isclass(found) and f"self.{part} " in inspect.getsource(found):
            return True  # an attribute its instances set
        elif inspect.ismodule(found):
            try:
                found = importlib.import_module(f"{found.__name__}.{part}")
            except ImportError:
                return False
        else:
            return False
    return True


def test_every_dotted_reference_in_a_docstring_resolves() -> None:
    stale = []
    for module in modules():
        # A quoted name the module itself writes as a string (a span attribute, a logger's name)
        # is a name of its own, not a reference.
        strings = set(re.findall(r"[\"'](miniqueue\.[\w.]+)[\"']", inspect.getsource(module)))
        for where, doc, namespace in documented(module):
            targets = [m[1] for m in _ROLE.finditer(doc)]
            targets += [m[1] for m in _QUOTED.finditer(doc) if m[1] not in strings]
            stale += [f"{where}: {target}" for target in targets if "." in target and not resolves(target, namespace)]
    assert not stale, "docstrings that name what is not there:\n" + "\n".join(sorted(set(stale)))
