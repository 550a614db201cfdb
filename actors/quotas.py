"""Accounts' usage caps in a placer round (docs/quotas.md): :class:`AccountQuota` as the round
reads it, and :class:`QuotaLedger`, each capped account's cap and use by the queue's account
index, counting what the round places.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import numpy as np

from runtime.accounts import quota_reason

NO_CAP = 2**62
"""A cap no use reaches: what an account without one is held to."""


@attrs.frozen(kw_only=True)
class AccountQuota:
    """A capped account as a round reads it: its caps (None: none) and the cpu_millis and
    memory_mb (MiB) its assigned and running jobs hold."""

    cpu_millis: int | None = None
    memory_mb: int | None = None
    used_cpu_millis: int = 0
    used_memory_mb: int = 0


@attrs.define
class QuotaLedger:
    """Each account's caps and use in one round, by account index (``PendingQueue.owners``);
    an account without an :class:`AccountQuota` is held to :data:`NO_CAP`."""

    cap_cpu: np.ndarray
    cap_mem: np.ndarray
    used_cpu: np.ndarray
    used_mem: np.ndarray
    owners: Sequence[str]

    @classmethod
    def of(cls, owners: Sequence[str], quotas: Mapping[str, AccountQuota]) -> QuotaLedger | None:
        """The ledger of ``owners`` (the queue's accounts, by index); None when none of them is
        capped (the round then checks nothing)."""
        held = [(k, quotas[name]) for k, name in enumerate(owners) if name in quotas]
        if not held:
            return None
        n = len(owners)
        ledger = cls(
            cap_cpu=np.full(n, NO_CAP, dtype=np.int64),
            cap_mem=np.full(n, NO_CAP, dtype=np.int64),
            used_cpu=np.zeros(n, dtype=np.int64),
            used_mem=np.zeros(n, dtype=np.int64),
            owners=owners,
        )
        for k, q in held:
            ledger.cap_cpu[k] = NO_CAP if q.cpu_millis is None else q.cpu_millis
            ledger.cap_mem[k] = NO_CAP if q.memory_mb is None else q.memory_mb
            ledger.used_cpu[k], ledger.used_mem[k] = q.used_cpu_millis, q.used_memory_mb
        return ledger

    def within(self, owner: np.ndarray, cpu: np.ndarray, mem: np.ndarray) -> np.ndarray:
        """Whether each job (its account index, cpu_millis, memory_mb) fits its account's caps
        on top of what the account uses now (bool array)."""
        return (self.used_cpu[owner] + cpu <= self.cap_cpu[owner]) & (
            self.used_mem[owner] + mem <= self.cap_mem[owner]
        )

    def fits(self, owner: int, cpu: int, mem: int) -> bool:
        """:meth:`within` for one job."""
        return bool(
            self.used_cpu[owner] + cpu <= self.cap_cpu[owner]
            and self.used_mem[owner] + mem <= self.cap_mem[owner]
        )

    def take(self, owner: int, cpu: int, mem: int) -> None:
        """Count a job the round places against its account."""
        self.used_cpu[owner] += cpu
        self.used_mem[owner] += mem

    def reasons(
        self, owner: np.ndarray, cpu: np.ndarray, mem: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
        """Of the jobs given (account index, cpu_millis, memory_mb), those over their account's
        caps as the round leaves them: (their positions in the arrays given, each one's reason
        key, key -> reason); the reason names cpu_millis when that cap is passed, else memory_mb
        (:func:`runtime.accounts.quota_reason`). A key is ``2 * account + (0 cpu, 1 memory)``."""
        over_cpu = self.used_cpu[owner] + cpu > self.cap_cpu[owner]
        over_mem = self.used_mem[owner] + mem > self.cap_mem[owner]
        at = np.flatnonzero(over_cpu | over_mem)
        keys = 2 * owner[at] + (~over_cpu[at]).astype(np.int64)
        said: dict[int, str] = {}
        for key in np.unique(keys).tolist():
            k, on_memory = divmod(key, 2)
            field, used, cap = (
                ("memory_mb", self.used_mem[k], self.cap_mem[k])
                if on_memory
                else ("cpu_millis", self.used_cpu[k], self.cap_cpu[k])
            )
            said[key] = quota_reason(self.owners[k], field, int(used), int(cap))
        return at, keys, said
