"""A ``dataclass`` decorator whose work waits for the class's first use.

The generated message module defines about 65 dataclasses, and :func:`dataclasses.dataclass`
spends about 0.25 ms on each (it writes and compiles ``__init__``): some 15 ms of every
process that imports :mod:`protocol`, while a client command uses a handful of messages.
:func:`dataclass`, which the generated module uses at run time (type checkers see the standard
one), defines the class at once and runs the standard decorator on it when it is first used:
called, asked for its dataclass fields (:func:`dataclasses.fields`, which betterproto2's
metadata reads before it encodes or parses one), or asked whether it is a dataclass.

Until then the class's metaclass is a subclass of its own that makes those uses finish the
class first; once finished, its metaclass is its own again, so the class is an ordinary
dataclass from then on and costs nothing more per instance.
"""

from __future__ import annotations

import dataclasses
import inspect
import threading
from abc import ABCMeta
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T", bound=type)

_FINISHING = threading.RLock()
"""Held while a class is finished, so a class another thread uses meanwhile waits for it."""


class _Unfinished(ABCMeta):
    """The metaclass of a message class until its first use (betterproto2's ``Message`` is an
    ``ABC``, so its classes' metaclass is :class:`abc.ABCMeta`)."""

    _dataclass_options: dict[str, Any]

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return finish(cls)(*args, **kwargs)

    def __getattr__(cls, name: str) -> Any:
        # Only names the class lacks come here: the dataclass ones make it finish itself.
        if name.startswith("__dataclass_"):
            return getattr(finish(cls), name)
        raise AttributeError(f"type object {cls.__name__!r} has no attribute {name!r}")


def finish(cls: T) -> T:
    """Run the standard decorator on ``cls`` (with the options :func:`dataclass` was given) if
    it has not run yet, and return ``cls``; safe from several threads at once. A subclass of an
    unfinished class has its bases finished instead."""
    with _FINISHING:
        if type(cls) is _Unfinished and "_dataclass_options" not in vars(cls):
            # A class made from an unfinished message (a subclass, not deferred itself): its
            # bases are finished, and it inherits what they become.
            for base in cls.__mro__[1:]:
                if type(base) is _Unfinished:
                    finish(base)
            derived: Any = cls
            derived.__class__ = ABCMeta
        if type(cls) is _Unfinished:
            unfinished: Any = cls
            undocumented = cls.__doc__ is None
            if undocumented:  # written below, once the signature is the finished class's
                cls.__doc__ = cls.__name__
            dataclasses.dataclass(**unfinished._dataclass_options)(cls)
            unfinished.__class__ = ABCMeta
            del unfinished._dataclass_options
            if undocumented:  # as the decorator writes it
                cls.__doc__ = cls.__name__ + str(inspect.signature(cls)).replace(" -> None", "")
    return cls


def dataclass(**options: Any) -> Callable[[T], T]:
    """``dataclasses.dataclass(**options)``, run when the class is first used (see the module).

    Raises:
        TypeError: the class's metaclass is not :class:`abc.ABCMeta` (the deferral swaps it),
            or ``options`` ask for ``slots`` (which makes a new class, so cannot be deferred).
    """
    if options.get("slots"):
        raise TypeError("a deferred dataclass cannot have slots: the decorator would make a new class")

    def defer(cls: T) -> T:
        if type(cls) is not ABCMeta:
            raise TypeError(f"{cls.__name__}: a deferred dataclass's metaclass must be ABCMeta")
        deferred: Any = cls
        deferred.__class__ = _Unfinished
        deferred._dataclass_options = options
        return cls

    return defer
