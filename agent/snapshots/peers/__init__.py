"""Shards between agents over TCP: the authenticated wire (wire.py), the shard server
every agent runs (server.py) and its client (client.py, with Peers, where each node's
server listens), a replica sent against the DP twin's shard as the chunks it lacks
(delta.py), and PeerFetcher, which brings other ranks' shards to a worker's DCP load
(fetcher.py). The shards themselves live in ../shard_store.py."""
