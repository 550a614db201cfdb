"""protocol.deferred: a message class becomes a dataclass on its first use, and is then the
same as one the standard decorator made; importing the protocol finishes none of them."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys
import threading
from abc import ABC, ABCMeta
from typing import Any

import pytest

from protocol import deferred, pb


def make(name: str, doc: str | None = None, *, defer: bool = True) -> Any:
    """A fresh class like a generated message (an ``ABC`` with defaults by factory)."""
    body = {
        "__annotations__": {"name": "str", "tags": "list[str]"},
        "name": dataclasses.field(default=""),
        "tags": dataclasses.field(default_factory=list),
        "__doc__": doc,
        "__module__": __name__,
    }
    cls = type(ABC)(name, (ABC,), body)
    decorator = deferred.dataclass if defer else dataclasses.dataclass
    return decorator(eq=False, repr=False)(cls)


@pytest.mark.parametrize(
    "first_use",
    [
        lambda cls: cls(name="a"),
        lambda cls: dataclasses.fields(cls),
        lambda cls: dataclasses.is_dataclass(cls),
        lambda cls: cls.__dataclass_params__,
    ],
    ids=["called", "fields", "is_dataclass", "params"],
)
def test_a_class_is_finished_by_its_first_use_and_is_then_a_plain_dataclass(first_use: Any) -> None:
    """Until used, the class is not a dataclass yet; any first use makes it one, with the
    metaclass, fields, signature and docstring the standard decorator gives."""
    cls, standard = make("Message"), make("Message", defer=False)
    assert type(cls) is not ABCMeta
    assert "__dataclass_fields__" not in vars(cls)
    first_use(cls)
    assert type(cls) is ABCMeta
    assert [(f.name, f.default) for f in dataclasses.fields(cls)] == [
        (f.name, f.default) for f in dataclasses.fields(standard)
    ]
    assert inspect.signature(cls) == inspect.signature(standard)
    assert cls.__doc__ == standard.__doc__
    made = cls(name="b")
    assert (made.name, made.tags) == ("b", [])


def test_a_documented_class_keeps_its_docstring() -> None:
    cls = make("Documented", "What it is.")
    deferred.finish(cls)
    assert cls.__doc__ == "What it is."


def test_a_missing_attribute_of_an_unfinished_class_is_an_attribute_error_and_finishes_nothing() -> None:
    cls = make("Missing")
    with pytest.raises(AttributeError, match="'Missing' has no attribute 'absent'"):
        cls.absent  # noqa: B018
    assert type(cls) is not ABCMeta


def test_threads_using_a_class_at_once_all_get_the_finished_class() -> None:
    """Sixteen threads making the same unfinished class's first instances: every one is made
    by the finished dataclass's ``__init__``; none sees it half finished."""
    cls = make("Raced")
    start, made, failed = threading.Barrier(16), [], []

    def use() -> None:
        start.wait()
        try:
            made.append(cls(name="x", tags=["t"]))
        except Exception as exc:  # reported below
            failed.append(exc)

    threads = [threading.Thread(target=use) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failed == []
    assert [(m.name, m.tags) for m in made] == [("x", ["t"])] * 16


def test_a_deferral_that_would_make_a_new_class_or_swap_another_metaclass_is_refused() -> None:
    with pytest.raises(TypeError, match="slots"):
        deferred.dataclass(slots=True)
    with pytest.raises(TypeError, match="metaclass must be ABCMeta"):
        deferred.dataclass()(type("Plain", (), {}))


def test_the_generated_messages_encode_and_parse_once_finished() -> None:
    """A message whose nested messages are still unfinished round-trips through its wire form."""
    reply = pb.StatusReply(workers=[pb.WorkerInfo(id="w-1", address="127.0.0.1:1")])
    assert pb.StatusReply.FromString(bytes(reply)) == reply


def test_importing_the_protocol_finishes_none_of_its_messages() -> None:
    """In a fresh process, every generated message is unfinished after ``import protocol``."""
    script = (
        "from protocol import pb, deferred\n"
        "names = [n for n in pb.__all__ if not n.endswith('Stub')]\n"
        "print(len(names), sum(type(getattr(pb, n)) is deferred._Unfinished for n in names))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout
    total, unfinished = map(int, out.split())
    assert total > 60
    assert unfinished == total


def test_a_subclass_of_an_unfinished_message_is_built_as_one_of_a_finished_one() -> None:
    """A plain subclass, and one made a dataclass itself, of a message not used yet: each is
    built, encodes and compares as before the deferral (its base is finished first)."""
    parent, other = make("Parent"), make("Other")

    class Plain(parent):  # type: ignore[misc, valid-type]
        pass

    @dataclasses.dataclass(eq=False, repr=False)
    class Made(other):  # type: ignore[misc, valid-type]
        pass

    assert type(parent) is not ABCMeta
    assert dataclasses.is_dataclass(Plain)
    for cls in (Plain, Made, Plain, Made):
        made = cls(name="x", tags=["t"])
        assert (made.name, made.tags, type(cls)) == ("x", ["t"], ABCMeta)
    assert type(parent) is ABCMeta and type(other) is ABCMeta

    class Request(pb.GetJobRequest):
        pass

    assert Request.FromString(bytes(Request(job_id=5))).job_id == 5
