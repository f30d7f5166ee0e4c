"""A tiny name -> function registry, so configs select objectives by string."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
  """Maps names to functions; `get` fails with the list of valid names.

  Usage::

      GATES = Registry("gate")

      @GATES.register("gap")
      def gap_gate(...): ...

      GATES.get("gap")
  """

  def __init__(self, kind: str):
    self.kind = kind
    self._items: dict[str, F] = {}

  def register(self, name: str) -> Callable[[F], F]:
    """Decorator registering a function under `name` (duplicates are an error)."""

    def decorator(fn: F) -> F:
      if name in self._items:
        raise ValueError(f"{self.kind} {name!r} is already registered")
      self._items[name] = fn
      return fn

    return decorator

  def unregister(self, name: str) -> None:
    """Removes `name` (for a test or a notebook that registered a temporary function)."""
    if name not in self._items:
      raise ValueError(f"unknown {self.kind} {name!r}; valid names: {self.names()}")
    del self._items[name]

  def get(self, name: str) -> F:
    """Returns the function registered as `name`."""
    try:
      return self._items[name]
    except KeyError:
      raise ValueError(f"unknown {self.kind} {name!r}; valid names: {self.names()}") from None

  def names(self) -> list[str]:
    """The registered names, sorted."""
    return sorted(self._items)

  def registered(self) -> list[str]:
    """The registered names, in the order they were registered."""
    return list(self._items)

  def __contains__(self, name: object) -> bool:
    return name in self._items

  def __iter__(self) -> Iterator[str]:
    return iter(self.names())

  def __repr__(self) -> str:
    return f"Registry({self.kind!r}, {self.names()})"
