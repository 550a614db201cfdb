"""The committed betterproto2 code matches protocol/*.proto (run `just proto` when it does not)."""

from __future__ import annotations

from protocol.generate import is_stale


def test_generated_protocol_code_is_current() -> None:
    """Regenerating from the .proto files reproduces the committed files byte for byte."""
    assert is_stale() == []


def test_each_message_classs_kept_type_hints_are_its_own() -> None:
    """The type hints protocol keeps per message class (betterproto2 asks for them once per
    field) are what typing.get_type_hints gives for that class, every class apart."""
    import sys
    import typing

    import betterproto2

    from protocol import pb

    messages = [c for c in vars(pb).values() if isinstance(c, type) and issubclass(c, betterproto2.Message)]
    assert len(messages) > 50
    for message in messages:
        expected = typing.get_type_hints(message, vars(sys.modules[message.__module__]), {})
        assert message._type_hints() == expected, message.__name__
        assert message._type_hints() is message._type_hints()


def test_the_messages_module_leaves_out_the_service_bases() -> None:
    """protocol.pb holds the messages and the stubs; the bases are in protocol.bases, each
    routing every method its stub calls."""
    from protocol import bases, pb

    assert not hasattr(pb, "ControlPlaneBase") and not hasattr(pb, "WorkerBase")
    for base, stub in ((bases.ControlPlaneBase, pb.ControlPlaneStub), (bases.WorkerBase, pb.WorkerStub)):
        routed = {path.rpartition("/")[2] for path in base().__mapping__()}  # type: ignore[abstract]
        methods = {name for name in vars(stub) if not name.startswith("_")}
        assert {"".join(w.title() for w in m.split("_")) for m in methods} == routed
