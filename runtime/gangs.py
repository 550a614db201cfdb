"""A gang task's seat in its gang (docs/gangs.md): what the leader sends with the assignment
and what the agent puts in the job's environment, converted at one edge."""

from __future__ import annotations

import attrs

from protocol import pb


@attrs.frozen(kw_only=True)
class GangSeat:
    """A task's place in its gang."""

    gang_id: int
    rank: int
    """0 .. size - 1."""
    size: int
    port: int
    """The port the leader gave this task on its worker (STOCKADE_GANG_PORT)."""
    peers: tuple[str, ...] = ()
    """host:port of every task of the gang, by rank (this one's included)."""

    def env(self) -> dict[str, str]:
        """The job's STOCKADE_GANG_* variables."""
        return {
            "STOCKADE_GANG_ID": str(self.gang_id),
            "STOCKADE_GANG_RANK": str(self.rank),
            "STOCKADE_GANG_SIZE": str(self.size),
            "STOCKADE_GANG_PORT": str(self.port),
            "STOCKADE_GANG_PEERS": ",".join(self.peers),
        }


def gang_seat_to_pb(seat: GangSeat | None) -> pb.GangSeat | None:
    """``seat`` as a ``GangSeat`` message (None: not a gang's task)."""
    if seat is None:
        return None
    return pb.GangSeat(
        gang_id=seat.gang_id, rank=seat.rank, size=seat.size, port=seat.port, peers=list(seat.peers)
    )


def gang_seat_from_pb(message: pb.GangSeat | None) -> GangSeat | None:
    """A ``GangSeat`` message as a :class:`GangSeat` (None or size 0: not a gang's task)."""
    if message is None or not message.size:
        return None
    return GangSeat(
        gang_id=message.gang_id,
        rank=message.rank,
        size=message.size,
        port=message.port,
        peers=tuple(message.peers),
    )
