"""The rendezvous store over etcd: its v3 JSON gateway (client.py, wire.py, members.py),
watches (watch.py, job_watch.py) and the KeyValueStore seam over it (store.py)."""
