"""rtrain.agent: the per-node agent (rendezvous, worker pool, supervision)."""
