"""The local cluster's launcher; :mod:`ops.cluster` is its public face, docs/development.md
("Layout") its modules."""
