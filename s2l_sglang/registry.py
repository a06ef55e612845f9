"""Named classes chosen at run time (scheduling policies, preemption modes, benchmark modes).

A `Registry` maps names to classes in registration order; its `register` decorator makes a new
kind selectable by adding one class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T", bound=type)


class Registry(Generic[T]):
    """Classes by name; `kind` names them in errors ("policy", "preemption mode", ...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.classes: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Class decorator: make the class selectable as `name` (sets its `name`)."""

        def deco(cls: T) -> T:
            if name in self.classes:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            cls.name = name
            self.classes[name] = cls
            return cls

        return deco

    def names(self) -> list[str]:
        """Registered names, in registration order (for CLI `choices`)."""
        return list(self.classes)

    def get(self, name: str) -> T:
        """The class registered as `name`, or a ValueError listing the choices."""
        try:
            return self.classes[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; choose from {self.names()}") from None
