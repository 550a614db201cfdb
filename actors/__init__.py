"""The control-plane actors and the nursery that assembles them (:mod:`actors.control_plane`)."""
