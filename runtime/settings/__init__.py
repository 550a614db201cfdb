"""Settings, grouped per component, with the unit in every name, passed explicitly.

Every timing knob and session setting of the actors and the agent is a field of a group; every
group validates itself at construction and raises :class:`runtime.errors.InvalidArgument`
naming the field, the value and the limit. The groups of the leader's work are in
:mod:`runtime.settings.leader` (lease, ledger, placer, reconciler, dispatch), the replica's
service and the whole replica in :mod:`runtime.settings.control_plane`
(:class:`~runtime.settings.control_plane.ControlPlaneSettings` checks the rules between
groups), the worker's in :mod:`runtime.settings.agent`, and what they are built from in
:mod:`runtime.settings.fields`. Defaults: DESIGN.md's "Defaults today"; docs/settings.md lists
the current values.
"""
