"""The small actor kit every Stockade process stands on: supervision, request/reply, the
trio-asyncio bridge (:mod:`runtime.aio`), the failover client (:mod:`runtime.client`),
settings, errors, logging, fault points, bounded text, and the one job spec every layer speaks
(:mod:`runtime.jobs`) with the rules both client and control plane apply
(:mod:`runtime.validation`); docs/development.md lists the modules. Imports only
:mod:`protocol`.
"""
