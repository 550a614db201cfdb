"""The small actor kit every Stockade process stands on.

Supervision (:mod:`runtime.supervisor`), request/reply between actors (:mod:`runtime.reply`),
the trio-asyncio bridge to asyncpg and grpclib (:mod:`runtime.aio`), the control-plane
client with failover (:mod:`runtime.client`, which replica it asks first :mod:`runtime.routes`,
its idempotency keys :mod:`runtime.idempotency_keys`), settings (:mod:`runtime.settings`), errors
(:mod:`runtime.errors`), logging (:mod:`runtime.log`), fault points for tests
(:mod:`runtime.faults`), text of unbounded size read and shown in bounded size
(:mod:`runtime.text`), and the one job spec every layer speaks (:mod:`runtime.jobs`, its
protobuf form :mod:`runtime.wire_jobs`, the input checks it is built from
:mod:`runtime.checks`), and the rules of the rest of what a client sends, which the client and
the control plane both apply (:mod:`runtime.validation`). Imports only :mod:`protocol`.
"""
