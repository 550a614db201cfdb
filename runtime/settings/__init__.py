"""Settings, grouped per component, with the unit in every name, passed explicitly.

Every timing knob and session setting of the actors and the agent is a field of a group; every
group validates itself at construction and raises :class:`runtime.errors.InvalidArgument`
naming the field, the value and the limit. By process: :mod:`runtime.settings.leader`,
:mod:`runtime.settings.control_plane` (with the rules between groups),
:mod:`runtime.settings.agent`; their validators: :mod:`runtime.settings.fields`.
docs/settings.md lists the current values.
"""
