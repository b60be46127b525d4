"""Shards between agents: ShardTransport, the one interface state moves through, and
TcpTransport, its implementation (transport.py) over the authenticated wire (wire.py)
to every agent's shard server (server.py) by its client (client.py); a replica sent
against the DP twin's shard as the chunks it lacks (delta.py); and this node's end of
it for a run, its server and whom it admits (endpoint.py). The shards themselves live
in ../shard_store.py."""
