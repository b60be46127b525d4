"""The rendezvous store seam: the typed KeyValueStore interface every agent module uses
(kv.py); its implementation over torch's TCPStore with bounded calls (torch_store.py)
and hosting or reaching a TCPStore (opening.py); its implementation over etcd
(etcd/: store.py, on client.py and the watches); choosing one (backends.py)."""
